#include "serve/exchange.h"

#include <algorithm>
#include <cctype>

namespace fleet::serve {

std::optional<std::string_view> ApiRequest::Header(std::string_view name) const {
  const auto same = [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  };
  for (const auto& [key, value] : headers) {
    if (std::equal(key.begin(), key.end(), name.begin(), name.end(), same)) {
      return std::string_view(value);
    }
  }
  return std::nullopt;
}

}  // namespace fleet::serve
