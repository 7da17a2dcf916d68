/* version.c: the library's version, for programs that link it dynamically. */
#include "../nabla.h"

const char *nb_version(void) { return NB_VERSION_STRING; }
