#include "worker/app.h"

int main(int argc, char** argv) { return fleet::worker::PsWorkerMain(argc, argv); }
