#include <iostream>
#include <string>
#include <vector>

#include "examples/gpt/convert_app.h"

int main(int argc, char** argv) {
  return fleet::examples::gpt::GptConvertMain(std::vector<std::string>(argv + 1, argv + argc),
                                              std::cout, std::cerr);
}
