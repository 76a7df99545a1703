// The sandbox init as a program of its own (openshell-init): the same
// init_main as `openshell __init`, in a binary of a few hundred KiB that
// build/openshell carries inside it (runtime/init_image.h). It starts in
// half the time of the whole binary and keeps a fraction of its memory,
// once per sandbox.
#include "runtime/init.h"

int main(int argc, char** argv) { return openshell::runtime::init_main(argc, argv); }
