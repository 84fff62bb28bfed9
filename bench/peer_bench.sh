#!/usr/bin/env bash
# smddp against gloo, DeepSpeed's shared-memory allreduce and Open MPI, in one run
# (bench/peer_bench.py), for 2 and 4 ranks. Sets up what the peers need in a venv of
# its own (build-peer/venv, on top of the system's Python, so torch and the build
# tools come from there): DeepSpeed 0.19.x and its dependencies, mpi4py (built
# against the system's Open MPI), matplotlib, and libsmddp's Python package built
# from this tree. A peer that cannot be installed is reported and skipped; the
# bench goes on with the others.
#
#   bash bench/peer_bench.sh [peer_bench.py options]     (default: -n 2, then -n 4)
#
# Needs the quick start's dependencies (bash .ci/deps). Output: the tables,
# build-peer/n2/ and build-peer/n4/ with peer_bench.csv and peer_bench.png.
set -uo pipefail
cd "$(dirname "$0")/.."
out=build-peer
venv=$out/venv
mkdir -p "$out"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --system-site-packages "$venv" || { echo "peer_bench.sh: cannot make a venv"; exit 1; }
fi
py=$venv/bin/python
note() { echo "peer_bench.sh: $*"; }
pipq() { "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Running pip as" ; return "${PIPESTATUS[0]}"; }

"$py" -c "import deepspeed" 2>/dev/null \
    || pipq "deepspeed==0.19.*" hjson msgpack py-cpuinfo psutil pydantic einops ninja tqdm \
    || note "DeepSpeed could not be installed; it is skipped"
"$py" -c "import mpi4py" 2>/dev/null || pipq mpi4py \
    || note "mpi4py could not be installed (it builds against Open MPI's mpicc); MPI is skipped"
"$py" -c "import matplotlib" 2>/dev/null || pipq matplotlib || note "no matplotlib: no plots"
# libsmddp's package from this tree, into the venv (rebuilt when the tree changed).
stamp=$(git rev-parse HEAD 2>/dev/null)$(git status --porcelain -- core abi plugin 2>/dev/null | md5sum | cut -c1-8)
if [ "$(cat "$out/installed" 2>/dev/null)" != "$stamp" ]; then
    pipq --no-build-isolation --no-deps --force-reinstall . || { note "cannot build libsmddp's package"; exit 1; }
    echo "$stamp" > "$out/installed"
fi

export DS_ACCELERATOR=cpu
# DeepSpeed's shared-memory op leaves its buffers in /dev/shm (about 550 MiB
# per run of 2 ranks, more with 4): the ones this run made go when it ends.
shm_before=$(ls /dev/shm 2>/dev/null | grep '^deepspeed_' | sort || true)
cleanup_ds_shm() {
    comm -13 <(echo "$shm_before") <(ls /dev/shm 2>/dev/null | grep '^deepspeed_' | sort) |
        while read -r f; do [ -n "$f" ] && rm -f "/dev/shm/$f"; done
}
trap cleanup_ds_shm EXIT
rc=0
if [ $# -gt 0 ]; then
    "$py" bench/peer_bench.py --out "$out" "$@" || rc=$?
else
    for n in 2 4; do
        "$py" bench/peer_bench.py -n "$n" --out "$out/n$n" || rc=$?
    done
fi
exit $rc
