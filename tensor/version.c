/* version.c: what this library is, and the vector path it runs on here. */
#include "../nabla.h"
#include "cpu_internal.h"

const char *nb_version(void) { return NB_VERSION_STRING; }

const char *nb_cpu_isa(void) { return nbi_isa_name(nbi_isa()); }
