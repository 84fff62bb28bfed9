#!/usr/bin/env bash
# Several "hosts" on one machine (network namespaces on a bridge, see
# lib.sh). For the layouts 2 nodes x 2 ranks and 3 x 2 it runs the C
# collectives (hierarchical, and allreduce flat), torch's collectives and DDP
# against gloo (torch_job.py); on 2 x 2 also torchrun across the namespaces
# (smddprun --nnodes), mpirun with smddprun as the per-rank wrapper (ns_rsh
# stands in for ssh), the collectives over links that drop 0.1% of packets
# and over a user-space wire adding 1 ms and 0.1% loss (wire.c), and the fault
# cases (a rank SIGKILLed, a link down, a rank that skips a collective, a
# node that dies and the survivors that shrink and train on).
# Removes everything it created, also when a check fails or it is killed.
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
passed=0
failed=0
# shellcheck source=test/netns/lib.sh
. "$HERE/lib.sh"

die() { echo "netns: $*" >&2; echo "netns: 0 passed, 1 failed"; exit 1; }

[ -x "$BENCH" ] || die "$BENCH not found: build first (meson setup $BUILD && meson compile -C $BUILD)"
command -v ip >/dev/null || die "'ip' (iproute2) is not installed"
[ "$(id -u)" = 0 ] || die "creating network namespaces needs root (running as uid $(id -u))"

trap ns_cleanup EXIT
trap 'exit 130' INT TERM

# run_job NAME NODES PER_NODE TIMEOUT CMD...: starts NODES x PER_NODE ranks,
# waits up to TIMEOUT s, passes if every rank exits 0. Output goes to
# $LOG/NAME.rank<r>.
run_job() {
    local name=$1 nodes=$2 per=$3 limit=$4
    shift 4
    start_ranks "$nodes" "$per" "$limit" "$LOG/$name" "$@"
    if wait_ranks; then
        passed=$((passed + 1))
        echo "PASS $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name (logs: $LOG/$name.rank*)"
        tail -n 5 "$LOG/$name.rank0"
    fi
}

# launch_job NAME RC: passes a launcher run that exited with RC 0 and whose
# ranks all logged a communicator spanning $nodes nodes.
launch_job() {
    local name=$1 rc=$2 spans
    spans=$(cat "$LOG/$name".* | grep -c "of $world, local rank .* $nodes node(s), transports: shm, ofi")
    if [ "$rc" -eq 0 ] && [ "$spans" -ge "$world" ]; then
        passed=$((passed + 1))
        echo "PASS $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name (exit $rc; logs naming a $nodes-node communicator: $spans; see $LOG/$name.*)"
        tail -n 5 "$LOG/$name".* | tail -n 20
    fi
}

# torchrun across the namespaces: smddprun --nnodes in each one, rendezvous
# on the first, every rank running torch_job.py (host names told apart by
# ns_exec, no SMDDP_HOSTNAME).
torchrun_job() {
    local name="${nodes}x${per}-smddprun-torchrun" port=$((20000 + RANDOM % 20000)) pids=() rc=0
    for ((i = 0; i < nodes; i++)); do
        ns_exec "$i" env SMDDP_DEBUG=INFO SMDDP_TIMEOUT=60 FI_TCP_IFACE=eth0 \
            GLOO_SOCKET_IFNAME=eth0 timeout -s KILL 300 "$SMDDPRUN" --nnodes "$nodes" \
            --node-rank "$i" --nproc-per-node "$per" --master-addr "$(ns_addr 0)" \
            --master-port "$port" "$HERE/torch_job.py" >"$LOG/$name.node$i" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    launch_job "$name" "$rc"
}

# mpirun across the namespaces (ns_rsh stands in for ssh), smddprun as the
# per-rank wrapper mapping Open MPI's variables for torch.
mpirun_job() {
    local name="${nodes}x${per}-mpirun-smddprun" hosts="" rc=0
    for ((i = 0; i < nodes; i++)); do hosts+="${hosts:+,}$(ns_addr "$i"):$per"; done
    ns_exec 0 timeout -s KILL 300 mpirun --allow-run-as-root --host "$hosts" -np "$world" \
        --mca plm_rsh_agent "$HERE/ns_rsh" --mca oob_tcp_if_include eth0 \
        --mca btl_tcp_if_include eth0 -x MASTER_ADDR="$(ns_addr 0)" -x SMDDP_DEBUG=INFO \
        -x SMDDP_TIMEOUT=60 -x FI_TCP_IFACE=eth0 -x GLOO_SOCKET_IFNAME=eth0 \
        "$SMDDPRUN" "$PY" "$HERE/torch_job.py" >"$LOG/$name.all" 2>&1 || rc=$?
    launch_job "$name" "$rc"
}

# fault_job NAME LIMIT HOW: 2 x 2 ranks loop over 1 MiB allreduces with a
# 20 s timeout; after 4 s, HOW strikes (kill: SIGKILL rank 3 on node 1; link:
# node 1's veth goes down). Passes when every surviving rank fails on its own
# (no hang, no kill by the harness) within LIMIT seconds of the strike, with
# an error message (for kill, every message must name rank 3), and no
# process or shared-memory segment is left behind.
fault_job() {
    local name="2x2-fault-$1" limit=$2 how=$1 rc=0 bad="" shm_before
    shm_before=$(ls /dev/shm | grep -c '^smddp-')
    SMDDP_TIMEOUT=20 start_ranks 2 2 120 "$LOG/$name" "$BENCH" -o allreduce -b 1M -e 1M \
        -n 100000000 -w 0 -c 0
    sleep 4
    local t0=$SECONDS
    if [ "$how" = kill ]; then
        pkill -KILL -P "${RANK_PIDS[3]}"
    else
        ip link set "${NS_TAG}h1" down
    fi
    for r in 0 1 2 3; do
        [ "$how" = kill ] && [ $r = 3 ] && { wait "${RANK_PIDS[3]}" 2>/dev/null; continue; }
        wait "${RANK_PIDS[$r]}"
        rc=$?
        local log="$LOG/$name.rank$r"
        if [ $rc -eq 0 ] || [ $rc -eq 137 ]; then
            bad+=" rank $r exited $rc;"
        elif ! grep -q "failed\|timed out\|aborted" "$log"; then
            bad+=" rank $r gave no error message;"
        elif [ "$how" = kill ] && ! grep "smddp_bench rank" "$log" | grep -q "rank 3"; then
            bad+=" rank $r's error does not name rank 3: $(grep "smddp_bench rank" "$log" | head -c 300);"
        fi
    done
    local took=$((SECONDS - t0))
    ip link set "${NS_TAG}h1" up
    # Nothing left behind: no rank still running in a namespace, no segment in /dev/shm.
    local left shm_after
    left=$( (ip netns pids "$(ns_name 0)"; ip netns pids "$(ns_name 1)") | wc -l)
    [ "$left" -eq 0 ] || bad+=" $left process(es) left in the namespaces;"
    shm_after=$(ls /dev/shm | grep -c '^smddp-')
    [ "$shm_after" -le "$shm_before" ] || bad+=" shared memory left: $(ls /dev/shm | grep '^smddp-' | tr '\n' ' ');"
    [ $took -le "$limit" ] || bad+=" took ${took} s (limit $limit s);"
    if [ -z "$bad" ]; then
        passed=$((passed + 1))
        echo "PASS $name (every rank failed with a message within $took s)"
    else
        failed=$((failed + 1))
        echo "FAIL $name:$bad (logs: $LOG/$name.rank*)"
    fi
}

# skip_job: 2 x 2 ranks through torch; rank 3 skips the sixth allreduce
# (skip_job.py). Passes when ranks 0-2 each fail in it with a message naming
# rank 3 with its last finished seq, as the others' error messages must say
# where every rank is, across nodes too.
skip_job() {
    local name="2x2-skipped-collective" bad="" r log
    start_ranks 2 2 90 "$LOG/$name" "$PY" "$HERE/skip_job.py"
    wait_ranks || bad+=" a rank exited non-zero;"
    for r in 0 1 2; do
        log="$LOG/$name.rank$r"
        grep -Eq "where the ranks are: ranks 0-2: in seq ([0-9]+); rank 3: finished seq [0-9]+ and has not started seq [0-9]+" "$log" ||
            bad+=" rank $r's error does not place rank 3: $(grep -m1 'error:' "$log" | head -c 400);"
    done
    grep -q "skipped the sixth" "$LOG/$name.rank3" || bad+=" rank 3 did not finish its sleep;"
    if [ -z "$bad" ]; then
        passed=$((passed + 1))
        echo "PASS $name (every survivor's error says where rank 3 is)"
    else
        failed=$((failed + 1))
        echo "FAIL $name:$bad (logs: $LOG/$name.rank*)"
    fi
}

# straggler_job: 2 x 2 ranks through torch; rank 3 sleeps 30 ms before each
# of 20 allreduces (straggler_job.py). Passes when every rank's smddp.stats(),
# which compares arrivals across nodes on clocks whose offsets it measured,
# names rank 3 with 0.6 s of lateness within 20 %.
straggler_job() {
    local name="2x2-straggler-named" bad="" r
    start_ranks 2 2 60 "$LOG/$name" "$PY" "$HERE/straggler_job.py"
    wait_ranks || bad+=" a rank's stats did not name rank 3:"
    for r in 0 1 2 3; do
        grep -q "stats: slowest rank 3," "$LOG/$name.rank$r" ||
            bad+=" rank $r: $(grep -m1 'stats:\|rror' "$LOG/$name.rank$r" | head -c 300);"
    done
    if [ -z "$bad" ]; then
        passed=$((passed + 1))
        echo "PASS $name ($(grep -o 'slowest rank.*' "$LOG/$name.rank0"))"
    else
        failed=$((failed + 1))
        echo "FAIL $name:$bad (logs: $LOG/$name.rank*)"
    fi
}

# shrink_job: 2 x 2 ranks train (smddp.examples.train_elastic); before step 4
# both ranks of node 1 SIGKILL themselves and rank 1 is 3 s late. Passes when
# ranks 0 and 1 agree that exactly ranks 2 and 3 are gone (rank 1, only
# slow, is kept), shrink to a group of 2 and finish with identical
# parameters.
shrink_job() {
    local name="2x2-node-dies-shrink" bad="" log0
    start_ranks 2 2 120 "$LOG/$name" "$PY" -m smddp.examples.train_elastic --steps 8 \
        --kill-rank 2,3 --kill-step 4 --slow-rank 1 --slow-s 3 --timeout 30
    wait_ranks
    [ "${RANK_RCS[0]}" = 0 ] && [ "${RANK_RCS[1]}" = 0 ] || bad+=" ranks 0 and 1 exited ${RANK_RCS[0]} ${RANK_RCS[1]};"
    [ "${RANK_RCS[2]}" != 0 ] && [ "${RANK_RCS[3]}" != 0 ] || bad+=" node 1's ranks did not die;"
    log0="$LOG/$name.rank0"
    grep -q "shrunk: ranks \[2, 3\] gone, world size 2" "$log0" || bad+=" no shrink to ranks 0,1: $(grep -m1 'shrunk\|error' "$log0" | head -c 300);"
    grep -q "step 8 world size 2" "$log0" || bad+=" training did not finish on 2 ranks;"
    grep -q "survivors' parameters identical" "$log0" || bad+=" the survivors' parameters differ;"
    if [ -z "$bad" ]; then
        passed=$((passed + 1))
        echo "PASS $name ($(grep -o 'ranks \[2, 3\] gone.*' "$log0"))"
    else
        failed=$((failed + 1))
        echo "FAIL $name:$bad (logs: $LOG/$name.rank*)"
    fi
}

# nft_packets: packets counted by the nftables rules of both nodes' namespaces.
nft_packets() {
    for i in 0 1; do ip netns exec "$(ns_name "$i")" nft list ruleset; done |
        grep -o 'packets [0-9]*' | awk '{s += $2} END {print s + 0}'
}

# lossy_job: 0.1% of the packets each node sends are dropped (nftables in
# both namespaces; this kernel has no sch_netem for tc's delay and loss, and
# no nfqueue to delay in user space), while the collectives run with their
# results checked; TCP must recover every loss, and results stay exact.
lossy_job() {
    if ! command -v nft >/dev/null; then
        failed=$((failed + 1))
        echo "FAIL 2x2-lossy: nft (nftables) is not installed"
        return
    fi
    for i in 0 1; do
        ip netns exec "$(ns_name "$i")" nft -f - <<'NFT' || { failed=$((failed + 1)); echo "FAIL 2x2-lossy: nftables rules refused"; return; }
table inet smddp_loss {
    chain out {
        type filter hook output priority 0; policy accept;
        oifname "eth0" numgen random mod 1000 == 0 counter drop
    }
}
NFT
    done
    for op in allreduce allgather reduce_scatter alltoall; do
        run_job "2x2-lossy-$op" 2 2 180 "$BENCH" -o "$op" -b 8 -e 32M -f 8 -n 5 -w 1 -c 1
    done
    local dropped
    dropped=$(nft_packets)
    echo "  (packets dropped: $dropped)"
    if [ "$dropped" -eq 0 ]; then
        failed=$((failed + 1))
        echo "FAIL 2x2-lossy: no packet was dropped, so the loss was not exercised"
    fi
    for i in 0 1; do ip netns exec "$(ns_name "$i")" nft delete table inet smddp_loss; done
}

# firewall_job: node firewalls that reject TCP to every port but the store's
# and libfabric's (FI_TCP_PORT_LOW/HIGH_RANGE), as sites that open only
# those do, so the liveness watch's own connections are refused; rank 3 then
# stalls (SIGSTOP) for 6 s in the middle of checked allreduces. The others
# wait for it and must not take the refusals for its death: every rank
# finishes with exact results.
firewall_job() {
    local name="2x2-firewall-stall" ok=1 rejected missed
    for i in 0 1; do
        ip netns exec "$(ns_name "$i")" sysctl -qw net.ipv4.ip_local_port_range="50000 60999" || ok=0
        ip netns exec "$(ns_name "$i")" nft -f - <<'NFT' || ok=0
table inet smddp_fw {
    chain in {
        type filter hook input priority 0; policy accept;
        iifname "eth0" tcp dport != 20000-41999 tcp flags & (syn | ack) == syn counter reject with tcp reset
    }
}
NFT
    done
    if [ $ok = 0 ]; then
        failed=$((failed + 1))
        echo "FAIL $name: cannot set up the firewall (nft, sysctl)"
        return
    fi
    NS_ENV=(FI_TCP_PORT_LOW_RANGE=41000 FI_TCP_PORT_HIGH_RANGE=41999 SMDDP_TIMEOUT=60)
    start_ranks 2 2 120 "$LOG/$name" "$BENCH" -o allreduce -b 8 -e 16M -f 8 -n 100 -w 1 -c 1
    NS_ENV=()
    # Once rank 0 prints its table's header, the communicator is up (the
    # allreduces that follow take a few seconds, 16 MiB ones most of it).
    for ((k = 0; k < 1500; k++)); do
        grep -q '^#' "$LOG/$name.rank0" 2>/dev/null && break
        sleep 0.02
    done
    pkill -STOP -P "${RANK_PIDS[3]}"
    missed=$(grep -c 'wrong element' "$LOG/$name.rank0")   # rank 0's last line: it was done
    sleep 6
    pkill -CONT -P "${RANK_PIDS[3]}"
    if wait_ranks; then ok=1; else ok=0; fi
    rejected=$(nft_packets)
    for i in 0 1; do ip netns exec "$(ns_name "$i")" nft delete table inet smddp_fw; done
    if [ $ok = 1 ] && [ "$rejected" -gt 0 ] && [ "$missed" = 0 ]; then
        passed=$((passed + 1))
        echo "PASS $name ($rejected connection(s) rejected)"
    else
        failed=$((failed + 1))
        echo "FAIL $name (ranks all exited 0: $ok; connections rejected: $rejected, must be > 0;" \
            "rank 0 done before the stall: $missed, must be 0; logs: $LOG/$name.rank*)"
        grep -h "smddp_bench rank\|ERROR\|WARN" "$LOG/$name".rank* | head -n 5
    fi
}

# wired_job: 2 x 2 ranks whose nodes are joined only through test/netns/wire.c,
# which delays every frame by 1 ms and drops 0.1% of them (netem's "delay 1ms
# loss 0.1%", which this kernel lacks). The collectives' results are checked;
# an 8-byte allreduce must take over 2 ms (the delay is real) and the wire
# must have dropped frames (the loss is real).
wired_job() {
    ns_cleanup
    if ! cc -O2 -o "$LOG/wire" "$HERE/wire.c" 2>"$LOG/wire.build"; then
        failed=$((failed + 1))
        echo "FAIL 2x2-delay-loss: cannot build wire.c: $(head -3 "$LOG/wire.build")"
        return
    fi
    if ! make_wired_pair "$LOG/wire" 1000 1000 "$LOG/wire.log"; then
        failed=$((failed + 1))
        echo "FAIL 2x2-delay-loss: cannot join two namespaces through TAP devices (is /dev/net/tun there?)"
        return
    fi
    for op in allreduce allgather reduce_scatter broadcast; do
        run_job "2x2-delay-loss-$op" 2 2 240 "$BENCH" -o "$op" -b 8 -e 4M -f 8 -n 5 -w 1 -c 1
    done
    local t8
    t8=$(awk '$1 == 8 && $4 == "sum" {print $5}' "$LOG/2x2-delay-loss-allreduce.rank0")
    kill "$WIRE_PID" 2>/dev/null
    wait "$WIRE_PID" 2>/dev/null
    local dropped
    dropped=$(sed -n 's/.*dropped \([0-9]*\) + \([0-9]*\).*/\1 \2/p' "$LOG/wire.log" |
        awk '{print $1 + $2}')
    echo "  (8-byte allreduce: ${t8:-?} us; $(cat "$LOG/wire.log"))"
    if ! awk -v t="${t8:-0}" 'BEGIN {exit !(t >= 2000)}'; then
        failed=$((failed + 1))
        echo "FAIL 2x2-delay-loss: an 8-byte allreduce took ${t8:-?} us; the 1 ms wire should make it >= 2000"
    fi
    if [ "${dropped:-0}" -eq 0 ]; then
        failed=$((failed + 1))
        echo "FAIL 2x2-delay-loss: the wire dropped no frame, so the loss was not exercised"
    fi
    ns_cleanup
}

SMDDPRUN=$(command -v smddprun || true)
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
    NS_ENV=(SMDDP_NET_ALGO=flat)
    run_job "${nodes}x${per}-allreduce-flat" "$nodes" "$per" 120 \
        "$BENCH" -o allreduce -b 8 -e 4M -f 16 -n 3 -w 1 -c 1
    NS_ENV=()
    if "$PY" -c "import torch, smddp" 2>/dev/null; then
        run_job "${nodes}x${per}-torch" "$nodes" "$per" 300 "$PY" "$HERE/torch_job.py"
        world=$((nodes * per))
        if [ "$nodes" = 2 ]; then
            if [ -z "$SMDDPRUN" ]; then
                failed=$((failed + 1))
                echo "FAIL launchers: smddprun is not on PATH (pip install first)"
            else
                torchrun_job
                if command -v mpirun >/dev/null; then
                    mpirun_job
                else
                    failed=$((failed + 1))
                    echo "FAIL ${nodes}x${per}-mpirun: mpirun (openmpi-bin) is not installed"
                fi
            fi
        fi
    else
        failed=$((failed + 1))
        echo "FAIL ${nodes}x${per}-torch: python cannot import torch and smddp (pip install first)"
    fi
    if [ "$nodes" = 2 ]; then
        lossy_job
        firewall_job
        fault_job kill 25
        fault_job link 40
        "$PY" -c "import torch, smddp" 2>/dev/null && skip_job && straggler_job && shrink_job
        wired_job
    fi
    ns_cleanup
done
echo "netns: $passed passed, $failed failed"
[ $failed -eq 0 ]
