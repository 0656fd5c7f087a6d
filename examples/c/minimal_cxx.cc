// examples/c/minimal.c compiled as C++ (CMakeLists.txt builds it where a C++ compiler is
// installed): include/batchwire/ must stay usable from C++ programs.
#include "minimal.c"
