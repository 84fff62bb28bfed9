# Several "hosts" on one machine, sourced by test/netns/run.sh and
# bench/netns_bench.sh: one network namespace per node, each joined to a
# bridge by a veth pair (10.77.<id>.<node + 1>/24, interface eth0), ranks
# started inside them with `ip netns exec` and told their node by
# SMDDP_HOSTNAME (the namespaces share the host name). The caller traps EXIT
# to ns_cleanup, which removes everything made here and kills what runs in it.
NS_ID=$(( $$ % 200 + 20 ))           # third octet of this run's subnet
NS_TAG=s$$                           # prefix of every name this run creates
NS_BR=${NS_TAG}br
NODES_UP=0
NS_ENV=()                            # extra NAME=value for every rank
NS_CPUS=${NS_CPUS:-shared}           # shared | split: see node_cpus
RANK_PIDS=()
RANK_RCS=()
WIRE_PID=""                          # make_wired_pair's relay

ns_name() { echo "${NS_TAG}n$1"; }
ns_addr() { echo "10.77.$NS_ID.$(( $1 + 1 ))"; }

ns_cleanup() {
    for ((i = 0; i < NODES_UP; i++)); do
        local ns
        ns=$(ns_name "$i")
        # Ranks left behind by a failed check die with their namespace.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
        ip link del "${NS_TAG}h$i" 2>/dev/null
    done
    ip link del "$NS_BR" 2>/dev/null
    if [ -n "$WIRE_PID" ]; then
        kill "$WIRE_PID" 2>/dev/null
        wait "$WIRE_PID" 2>/dev/null
        WIRE_PID=""
        for i in 0 1; do
            ip link del "${NS_TAG}t$i" 2>/dev/null
            ip link del "${NS_TAG}b$i" 2>/dev/null
        done
    fi
    NODES_UP=0
}

# make_wired_pair WIRE DELAY_US LOSS_PER_MILLION LOG: two nodes as make_nodes
# makes them, but each on a bridge of its own, the two bridges joined by a
# TAP device each and the user-space relay WIRE (test/netns/wire.c) between
# them, which delays every frame and drops some: netem without sch_netem.
make_wired_pair() {
    local wire=$1 delay=$2 loss=$3 log=$4
    for i in 0 1; do
        local br=${NS_TAG}b$i tap=${NS_TAG}t$i
        ip link add "$br" type bridge || return 1
        ip link set "$br" up || return 1
        ip tuntap add dev "$tap" mode tap || return 1
        ip link set "$tap" master "$br" || return 1
        ip link set "$tap" up || return 1
        add_node "$i" "$br" || return 1
    done
    "$wire" "${NS_TAG}t0" "${NS_TAG}t1" "$delay" "$loss" >"$log" 2>&1 &
    WIRE_PID=$!
}

# add_node I BRIDGE: namespace I with eth0 at ns_addr I, its veth's host end on BRIDGE.
add_node() {
    local i=$1 br=$2 ns
    ns=$(ns_name "$i")
    ip netns add "$ns" || return 1
    NODES_UP=$((i + 1))
    ip link add "${NS_TAG}h$i" type veth peer name "${NS_TAG}c$i" || return 1
    ip link set "${NS_TAG}c$i" netns "$ns" || return 1
    ip -n "$ns" link set "${NS_TAG}c$i" name eth0 || return 1
    ip -n "$ns" addr add "$(ns_addr "$i")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    # Outgoing connections take ports from 50000 up, clear of the store's
    # (20000-39999) and of the ranges jobs give libfabric (41000-41999): a
    # port an earlier job's connection left in TIME_WAIT cannot be bound.
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="50000 60999" || return 1
    ip link set "${NS_TAG}h$i" master "$br" || return 1
    ip link set "${NS_TAG}h$i" up || return 1
}

# make_nodes N: namespaces 0..N-1 on one bridge.
make_nodes() {
    local n=$1
    ip link add "$NS_BR" type bridge || return 1
    ip link set "$NS_BR" up || return 1
    for ((i = 0; i < n; i++)); do add_node "$i" "$NS_BR" || return 1; done
}

# The environment of one rank on node NODE: ns_env RANK WORLD PER NODE PORT.
ns_env() {
    local r=$1 world=$2 per=$3 node=$4 port=$5
    echo SMDDP_RANK=$r SMDDP_WORLD_SIZE=$world RANK=$r WORLD_SIZE=$world \
        LOCAL_RANK=$((r % per)) LOCAL_WORLD_SIZE=$per \
        SMDDP_MASTER_ADDR="$(ns_addr 0)" SMDDP_MASTER_PORT=$port \
        MASTER_ADDR="$(ns_addr 0)" MASTER_PORT=$((port + 1)) \
        SMDDP_HOSTNAME=host$node FI_TCP_IFACE=eth0 GLOO_SOCKET_IFNAME=eth0
}

# node_cpus NODE NODES: the CPUs node NODE's ranks may run on, as a taskset
# list. NS_CPUS=shared (the default): every CPU this shell may use. split:
# the NODE-th of NODES equal slices of them (node i % CPUs when nodes
# outnumber CPUs), so that "hosts" have cores of their own, as real ones do,
# and one host's TCP and copies do not run on another host's cores. The
# CPUs are ordered by physical core first, so that the hardware threads of
# one core stay in one slice when the slices are whole cores.
node_cpus() {
    local node=$1 nodes=$2 list c
    case $NS_CPUS in
    shared | split) ;;
    *) echo "node_cpus: NS_CPUS is \"$NS_CPUS\"; it takes shared or split" >&2; return 1 ;;
    esac
    command -v taskset >/dev/null || { echo "node_cpus: taskset (util-linux) is missing" >&2; return 1; }
    list=$(taskset -pc $$ | sed 's/.*: //' | tr ',' ' ')
    local all=()
    for c in $list; do
        if [[ $c == *-* ]]; then all+=($(seq "${c%-*}" "${c#*-}")); else all+=("$c"); fi
    done
    local n=${#all[@]}
    [ "$n" -gt 0 ] || { echo "node_cpus: cannot read this shell's CPUs from taskset" >&2; return 1; }
    if [ "$NS_CPUS" = split ]; then
        # Sort by (package, core, cpu); without sysfs topology, by cpu alone.
        local keyed=() topo=/sys/devices/system/cpu
        for c in "${all[@]}"; do
            keyed+=("$(cat "$topo/cpu$c/topology/physical_package_id" 2>/dev/null || echo 0) $(cat \
                "$topo/cpu$c/topology/core_id" 2>/dev/null || echo "$c") $c")
        done
        mapfile -t all < <(printf '%s\n' "${keyed[@]}" | sort -n -k1,1 -k2,2 -k3,3 | cut -d' ' -f3)
    fi
    if [ "$NS_CPUS" = shared ]; then
        local IFS=,
        echo "${all[*]}"
    elif [ "$nodes" -gt "$n" ]; then
        echo "${all[$((node % n))]}"
    else
        local lo=$((node * n / nodes)) hi=$(((node + 1) * n / nodes)) IFS=,
        echo "${all[*]:$lo:$((hi - lo))}"
    fi
}

# start_ranks NODES PER LIMIT LOGPREFIX CMD...: starts NODES x PER ranks
# (rank = node * PER + local) on node_cpus under `timeout -s KILL LIMIT`,
# output to LOGPREFIX.rank<r>; their pids go to RANK_PIDS.
start_ranks() {
    local nodes=$1 per=$2 limit=$3 log=$4
    shift 4
    local world=$((nodes * per)) port=$((20000 + RANDOM % 20000))
    RANK_PIDS=()
    for ((r = 0; r < world; r++)); do
        local node=$((r / per)) on=() cpus
        if [ "$NS_CPUS" != shared ]; then
            cpus=$(node_cpus "$node" "$nodes") || return 1
            on=(taskset -c "$cpus")
        fi
        # shellcheck disable=SC2046
        ip netns exec "$(ns_name "$node")" env $(ns_env "$r" "$world" "$per" "$node" "$port") \
            SMDDP_TIMEOUT="${SMDDP_TIMEOUT:-60}" "${NS_ENV[@]}" "${on[@]}" \
            timeout -s KILL "$limit" "$@" >"$log.rank$r" 2>&1 &
        RANK_PIDS+=($!)
    done
}

# wait_ranks: waits for RANK_PIDS; each rank's exit status goes to RANK_RCS;
# returns the last non-zero one.
wait_ranks() {
    local rc=0 r
    RANK_RCS=()
    for ((r = 0; r < ${#RANK_PIDS[@]}; r++)); do
        RANK_RCS[r]=0
        wait "${RANK_PIDS[$r]}" || { rc=$?; RANK_RCS[r]=$rc; echo "  rank $r exited $rc"; }
    done
    return $rc
}

# ns_exec NODE CMD...: runs CMD in node NODE's namespace under a host name of
# its own (a new UTS namespace named like the network namespace), as on a
# real host: launchers and libraries that tell nodes apart by host name
# (Open MPI, torchrun, smddp without SMDDP_HOSTNAME) see NODES machines.
ns_exec() {
    local ns
    ns=$(ns_name "$1")
    shift
    ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}
