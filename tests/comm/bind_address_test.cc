#include "comm/bind_address.h"

#include <gtest/gtest.h>

namespace fleet {
namespace {

TEST(BindAddressTest, NamesResolveToABindableNumericAddress) {
  auto local = ResolveBindAddress("localhost", "--gloo_hostname");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_TRUE(*local == "127.0.0.1" || *local == "::1") << *local;
  auto numeric = ResolveBindAddress("127.0.0.1", "--gloo_hostname");
  ASSERT_TRUE(numeric.ok()) << numeric.status().ToString();
  EXPECT_EQ(*numeric, "127.0.0.1");
}

TEST(BindAddressTest, BadNamesAreInvalidArgumentNamingSourceAndValue) {
  struct Case {
    std::string host, message_start;
  };
  for (const Case& c : {Case{"no_such_host", "--gloo_hostname: cannot resolve 'no_such_host' ("},
                        Case{"", "--gloo_hostname: empty"},
                        Case{"192.0.2.1", "--gloo_hostname: '192.0.2.1' (192.0.2.1) is not an address"}}) {
    auto r = ResolveBindAddress(c.host, "--gloo_hostname");
    ASSERT_FALSE(r.ok()) << c.host;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    EXPECT_EQ(r.status().message().rfind(c.message_start, 0), 0u) << r.status().message();
  }
}

TEST(BindAddressTest, InterfacesResolveThroughGetifaddrs) {
  auto lo = InterfaceAddress("lo", "--gloo_iface");
  ASSERT_TRUE(lo.ok()) << lo.status().ToString();
  EXPECT_EQ(*lo, "127.0.0.1");
  auto none = InterfaceAddress("no_such_if0", "--gloo_iface");
  ASSERT_TRUE(none.status().IsInvalidArgument()) << none.status().ToString();
  EXPECT_NE(none.status().message().find("--gloo_iface: no network interface 'no_such_if0'"),
            std::string::npos);
  EXPECT_NE(none.status().message().find("lo"), std::string::npos);  // lists what exists
}

}  // namespace
}  // namespace fleet
