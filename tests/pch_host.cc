// Host of the precompiled header every test reuses (cmake/FleetTest.cmake):
// a target of its own, compiled with exactly a test's flags, so that GCC
// accepts its precompiled header in every test file. Never run.
int main() { return 0; }
