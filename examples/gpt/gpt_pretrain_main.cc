#include <iostream>
#include <string>
#include <vector>

#include "examples/gpt/pretrain_app.h"

int main(int argc, char** argv) {
  return fleet::examples::gpt::GptPretrainMain(
      argv[0], std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
