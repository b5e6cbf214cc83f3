#include "examples/mnist_mlp/mnist_app.h"

int main(int argc, char** argv) { return fleet::examples::MnistMain(argc, argv); }
