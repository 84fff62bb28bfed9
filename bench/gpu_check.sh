#!/usr/bin/env bash
# One script for a GPU machine: build, GPU tests, GPU benchmarks.
#
#   bash bench/gpu_check.sh [OUT_DIR]
#
# Needs: nvcc, meson, ninja, a C compiler, and a python3 with torch (CUDA) and
# pytest. No package registry is used; libfabric and CMocka are optional.
# Steps (each bounded by a timeout, each reported, the script goes on after
# a failure and exits non-zero if any step failed):
#   1. build (meson, -Dcuda=enabled -Dtorch=enabled) into build-gpu/
#   2. meson test --suite gpu: kernels bit for bit against the CPU kernels,
#      every CUDA collective and CUDA send/recv on 2 and 4 ranks sharing GPU 0,
#      the same across 2 fake nodes staged through host memory (where
#      libfabric is installed), the NCCL interposer and the collectives
#      routed to NCCL (one rank)
#   3. reduction kernel bandwidth against cudaMemcpy D2D (same run)
#   4. CUDA allreduce/allgather/reduce_scatter, 2 and 4 ranks, C API; and
#      2 ranks on 2 fake nodes, staged through host memory (and through NCCL
#      where there are 2 GPUs)
#   5. the backend on CUDA tensors through torch: pytest test/python/test_gpu.py
#   6. bench/gpu_torch_bench.py: 2 and 4 ranks through torch beside torch's add
#   7. torch's nccl backend with libsmddp preloaded: the interposer serves it
#   8. SMDDP_CUDA_SYNC=kernel (flags in device memory): latency 8 B to 1 MiB
#      and busbw to 256 MiB for 2 and 4 ranks beside the events path; one-shot
#      against two-shot (SMDDP_CUDA_ONESHOT_MAX) for the crossover; inputs
#      read in place (SMDDP_CUDA_REGISTER_MIN=1M) against copied in; the torch
#      GPU tests and torch bench on it (its C GPU tests are in step 2)
# The limits add up to more than one 10-minute device call: on a lent GPU, run
# it in two calls (STEPS="build gpu_tests ..." picks steps; default all).
# Logs go to OUT_DIR (default build-gpu/check); a summary line ends the run.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${1:-$BUILD/check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
failed=()
start=$(date +%s)

ran=0
STEPS=${STEPS:-}
step() {  # step NAME TIMEOUT_S command...
    local name=$1 limit=$2; shift 2
    if [ -n "$STEPS" ] && [[ " $STEPS " != *" $name "* ]]; then return 0; fi
    ran=$((ran + 1))
    local t0=$(date +%s)
    echo "== $name (limit ${limit}s) =="
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: rc=$rc, $(( $(date +%s) - t0 )) s =="
    [ "$rc" -eq 0 ] || failed+=("$name(rc=$rc)")
    return "$rc"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    nvcc --version | tail -1
    $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    meson --version
} 2>&1 | tee "$OUT/env.log"

build() {
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" -Dbuildtype=release -Dcuda=enabled -Dtorch=enabled \
            -Dgpu_archs=${GPU_ARCHS:-80,90} || return 1
    fi
    ninja -C "$BUILD"
}
export -f build; export BUILD
step build 300 bash -c build || { echo "gpu_check: build failed"; echo "gpu_check: 0 passed, 1 failed"; exit 1; }

# The real NCCL for the NCCL tests: SMDDP_NCCL_LIBRARY, else torch's (nvidia-nccl wheel).
if [ -z "${SMDDP_NCCL_LIBRARY:-}" ]; then
    SMDDP_NCCL_LIBRARY=$($PY -c 'import glob, os, nvidia.nccl as n; print(sorted(glob.glob(os.path.join(list(n.__path__)[0], "lib", "libnccl.so*")))[0])' 2>/dev/null || true)
fi
export SMDDP_NCCL_LIBRARY
echo "NCCL library: ${SMDDP_NCCL_LIBRARY:-(not found; libnccl.so.2 from the loader path)}"

step gpu_tests 300 meson test -C "$BUILD" --suite gpu --verbose --no-rebuild
step kernel_bench 60 "$BUILD/bench/smddp_gpu_bench" kernel -e 1G
step coll_bench_2 60 "$BUILD/bench/smddp_gpu_bench" coll -p 2 -b 1M -e 256M
step coll_bench_4 90 "$BUILD/bench/smddp_gpu_bench" coll -p 4 -b 1M -e 256M
# Across 2 fake nodes (needs libfabric): staged through host memory; and
# through NCCL for comparison where there is a GPU per rank (NCCL refuses two
# ranks on one GPU).
if ldd "$BUILD/abi/libsmddp.so" 2>/dev/null | grep -q libfabric; then
    step coll_bench_staged 120 env SMDDP_CUDA_NET=staged \
        "$BUILD/bench/smddp_gpu_bench" coll -p 2 -N 2 -b 1M -e 64M
    if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
        step coll_bench_nccl_2n 120 env SMDDP_CUDA_NET=nccl \
            "$BUILD/bench/smddp_gpu_bench" coll -p 2 -N 2 -b 1M -e 64M
    fi
else
    echo "(no libfabric in this build: the staged-across-nodes benchmark is skipped)"
fi

# The package from the build tree (no pip install: no registry, no meson-python).
PKG=$(cd "$BUILD" && pwd)/pkg
rm -rf "$PKG" && mkdir -p "$PKG/smddp"
cp -r plugin/python/smddp/. "$PKG/smddp/"
cp plugin/python/smddp_autoload.py "$PKG/"
cp "$BUILD"/plugin/torch/_C*.so "$BUILD"/plugin/torch/libsmddp.so "$PKG/smddp/"
export PYTHONPATH=$PKG${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

step torch_tests 240 $PY -m pytest test/python/test_gpu.py -v -p no:cacheprovider
step torch_bench 180 $PY bench/gpu_torch_bench.py --ranks 2 4 --max-bytes 256M
step nccl_preload 120 $PY test/gpu/nccl_preload.py "$PKG/smddp/libsmddp.so"

# Kernel-side synchronisation against the events path, same run.
B="$BUILD/bench/smddp_gpu_bench"
step latency_events_2 60 "$B" coll -p 2 -b 8 -e 1M
step latency_kernel_2 60 env SMDDP_CUDA_SYNC=kernel "$B" coll -p 2 -b 8 -e 1M
step coll_kernel_2 90 env SMDDP_CUDA_SYNC=kernel "$B" coll -p 2 -b 1M -e 256M
step coll_kernel_registered_2 90 env SMDDP_CUDA_SYNC=kernel SMDDP_CUDA_REGISTER_MIN=1M "$B" coll -p 2 -b 1M -e 256M
step coll_kernel_4 120 env SMDDP_CUDA_SYNC=kernel "$B" coll -p 4 -b 8 -e 256M
step oneshot_only_2 60 env SMDDP_CUDA_SYNC=kernel SMDDP_CUDA_ONESHOT_MAX=1G "$B" coll -p 2 -b 4K -e 64M
step twoshot_only_2 60 env SMDDP_CUDA_SYNC=kernel SMDDP_CUDA_ONESHOT_MAX=0 "$B" coll -p 2 -b 4K -e 64M
step torch_tests_kernel 240 env SMDDP_CUDA_SYNC=kernel $PY -m pytest test/python/test_gpu.py -v -p no:cacheprovider
step torch_bench_kernel 180 env SMDDP_CUDA_SYNC=kernel $PY bench/gpu_torch_bench.py --ranks 2 4 --min-bytes 8 --max-bytes 256M

nfail=${#failed[@]}
echo "gpu_check: $(( $(date +%s) - start )) s; failed steps: ${failed[*]:-none}"
echo "gpu_check: $(( ran - nfail )) passed, $nfail failed"
[ "$nfail" -eq 0 ]
