/*
 * What the GPU test programs share: CUDA checks inside a rank (H_CHECK), a
 * forked child to run CUDA in (a CUDA context does not survive fork(), so
 * the parent never touches CUDA), and the device probe that decides skipping.
 */
#ifndef SMDDP_TEST_GPU_UTIL_H
#define SMDDP_TEST_GPU_UTIL_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../unit/harness.h"

#define CU(call)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        H_CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));           \
    } while (0)

/* Runs fn(arg) in a child; returns its exit status (or 128 + signal). */
static inline int gpu_in_child(int (*fn)(void *), void *arg)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* 0 with GPU 0 described on stdout, or 77 (meson's skip) saying why not. */
static inline int gpu_probe(void *arg)
{
    (void)arg;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device usable here (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("GPU 0: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1 << 30));
    return 0;
}

#endif /* SMDDP_TEST_GPU_UTIL_H */
