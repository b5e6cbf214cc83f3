#include "heter/heter_worker.h"

int main(int argc, char** argv) { return fleet::heter::HeterWorkerMain(argc, argv); }
