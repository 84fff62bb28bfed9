#!/usr/bin/env bash
# Several "hosts" on one machine: one network namespace per node, each joined
# to a bridge by a veth pair (10.77.<id>.<node>/24), ranks started inside them
# with `ip netns exec` and told their node by SMDDP_HOSTNAME (the namespaces
# share the host name). Runs the multi-host checks for each layout, then
# removes everything it created, also when a check fails or it is killed.
#
#   test/netns/run.sh BUILD_DIR        (as root; BUILD_DIR has bench/smddp_bench)
#
# Needs `ip` (iproute2) and the right to create namespaces; if it cannot, it
# says why and fails: a multi-host suite that did not run is not a pass.
# Ends with "netns: N passed, N failed".
set -uo pipefail

BUILD=${1:?usage: test/netns/run.sh BUILD_DIR}
BENCH=$BUILD/bench/smddp_bench
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
ID=$(( $$ % 200 + 20 ))              # second octet of this run's subnet
TAG=s$$                              # prefix of every name this run creates
BR=${TAG}br
passed=0
failed=0
NODES_UP=0

die() { echo "netns: $*" >&2; echo "netns: 0 passed, 1 failed"; exit 1; }

[ -x "$BENCH" ] || die "$BENCH not found: build first (meson setup $BUILD && meson compile -C $BUILD)"
command -v ip >/dev/null || die "'ip' (iproute2) is not installed"
[ "$(id -u)" = 0 ] || die "creating network namespaces needs root (running as uid $(id -u))"

cleanup() {
    for ((i = 0; i < NODES_UP; i++)); do
        local ns=${TAG}n$i
        # Ranks left behind by a failed check die with their namespace.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
        ip link del "${TAG}h$i" 2>/dev/null
    done
    ip link del "$BR" 2>/dev/null
    NODES_UP=0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Creates N nodes: namespace ${TAG}n<i> with interface eth0 at 10.77.$ID.<i+1>.
make_nodes() {
    local n=$1
    ip link add "$BR" type bridge || return 1
    ip link set "$BR" up || return 1
    for ((i = 0; i < n; i++)); do
        local ns=${TAG}n$i
        ip netns add "$ns" || return 1
        NODES_UP=$((i + 1))
        ip link add "${TAG}h$i" type veth peer name "${TAG}c$i" || return 1
        ip link set "${TAG}c$i" netns "$ns" || return 1
        ip -n "$ns" link set "${TAG}c$i" name eth0 || return 1
        ip -n "$ns" addr add "10.77.$ID.$((i + 1))/24" dev eth0 || return 1
        ip -n "$ns" link set eth0 up || return 1
        ip -n "$ns" link set lo up || return 1
        ip link set "${TAG}h$i" master "$BR" || return 1
        ip link set "${TAG}h$i" up || return 1
    done
}

# run_job NAME NODES PER_NODE TIMEOUT CMD...: starts NODES x PER_NODE ranks
# (rank = node * PER_NODE + local), waits up to TIMEOUT s, passes if every
# rank exits 0. Output goes to $LOG/NAME.rank<r>.
run_job() {
    local name=$1 nodes=$2 per=$3 limit=$4
    shift 4
    local world=$((nodes * per)) port=$((20000 + RANDOM % 20000)) pids=() rc=0
    for ((r = 0; r < world; r++)); do
        local node=$((r / per))
        ip netns exec "${TAG}n$node" env \
            SMDDP_RANK=$r SMDDP_WORLD_SIZE=$world RANK=$r WORLD_SIZE=$world \
            LOCAL_RANK=$((r % per)) LOCAL_WORLD_SIZE=$per \
            SMDDP_MASTER_ADDR=10.77.$ID.1 SMDDP_MASTER_PORT=$port \
            MASTER_ADDR=10.77.$ID.1 MASTER_PORT=$((port + 1)) \
            SMDDP_HOSTNAME=host$node FI_TCP_IFACE=eth0 GLOO_SOCKET_IFNAME=eth0 \
            SMDDP_TIMEOUT=60 \
            timeout -s KILL "$limit" "$@" >"$LOG/$name.rank$r" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < world; r++)); do
        wait "${pids[$r]}" || { rc=$?; echo "  rank $r exited $rc"; }
    done
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        echo "PASS $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name (logs: $LOG/$name.rank*)"
        tail -n 5 "$LOG/$name.rank0"
    fi
}

LOG=$(mktemp -d /tmp/smddp-netns.XXXXXX)
for layout in "2 2" "3 2"; do
    read -r nodes per <<<"$layout"
    make_nodes "$nodes" || die "cannot create $nodes network namespaces joined by a bridge: \
see the error above (is this a container without CAP_NET_ADMIN?)"
    echo "== $nodes nodes x $per ranks =="
    for op in allreduce allgather reduce_scatter broadcast alltoall; do
        run_job "${nodes}x${per}-$op" "$nodes" "$per" 120 \
            "$BENCH" -o "$op" -b 8 -e 4M -f 16 -n 3 -w 1 -c 1
    done
    run_job "${nodes}x${per}-allreduce-bf16-avg" "$nodes" "$per" 120 \
        "$BENCH" -o allreduce -d bfloat16 -r avg -b 2 -e 1M -f 64 -n 2 -w 1 -c 1
    if "$PY" -c "import torch, smddp" 2>/dev/null; then
        run_job "${nodes}x${per}-torch" "$nodes" "$per" 300 "$PY" "$HERE/torch_job.py"
    else
        failed=$((failed + 1))
        echo "FAIL ${nodes}x${per}-torch: python cannot import torch and smddp (pip install first)"
    fi
    cleanup
done
echo "netns: $passed passed, $failed failed"
[ $failed -eq 0 ]
