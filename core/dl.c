/* See dl.h. */
#include "dl.h"

#include <dlfcn.h>

const char *smddp__dl_resolve(void *lib, const smddp__dl_sym_t *syms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) return syms[i].name;
    }
    return NULL;
}
