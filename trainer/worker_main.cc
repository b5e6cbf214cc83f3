#include "trainer/worker_app.h"

int main(int argc, char** argv) { return fleet::trainer::PsWorkerMain(argc, argv); }
