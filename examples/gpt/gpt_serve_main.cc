#include <iostream>
#include <string>
#include <vector>

#include "serve/gpt_serve_app.h"

int main(int argc, char** argv) {
  return fleet::serve::GptServeMain(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                    std::cerr);
}
