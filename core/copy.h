/* Copies into users' buffers, streaming past the caches when that saves memory traffic. */
#ifndef SMDDP_CORE_COPY_H
#define SMDDP_CORE_COPY_H

#include <stddef.h>

/*
 * memcpy, except that with stream set the destination is written with
 * non-temporal stores: a large result is not read again soon, and ordinary
 * stores would first read every destination line from memory (a third of a
 * copy's memory traffic). Ends with a store fence, so the data is visible to
 * other processes before any flag written after it.
 */
void smddp__copy(void *dst, const void *src, size_t n, int stream);

#endif /* SMDDP_CORE_COPY_H */
