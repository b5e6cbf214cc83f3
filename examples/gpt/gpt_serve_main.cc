#include <glog/logging.h>

#include <iostream>
#include <string>
#include <vector>

#include "serve/gpt_serve_app.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return fleet::serve::GptServeMain(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                    std::cerr);
}
