#include "ps/server_app.h"

int main(int argc, char** argv) { return fleet::ps::PsServerMain(argc, argv); }
