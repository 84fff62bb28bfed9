#!/usr/bin/env bash
# SageMaker's own training toolkit over libsmddp: the PyTorch training image's
# entry point (`train`, sagemaker-pytorch-training 2.7.0 over sagemaker-
# training 4.4.6, and over 5.1.4), run as SageMaker runs it, on hosts made of
# network, mount, UTS and PID namespaces (host.sh): the toolkit's smdataparallel
# runner itself decides, from the job's configuration and the libraries it
# finds under /opt/conda/lib, and starts `mpirun ... smddprun python -m mpi4py
# SCRIPT` (over SSH between two hosts). Each job's ranks leave their evidence
# (code/sm_common.py) and job.py checks it:
#
#   auto       communication backend auto: the runner exports
#              USE_SMDDP_COLLECTIVES=1, every rank's group is smddp, DDP's
#              allreduces ran in libsmddp, the parameters agree
#   nccl       backend nccl: the runner exports USE_SMDDP_COLLECTIVES=0,
#              nothing is preloaded, the ranks see nccl
#   no-libs    backend auto, but /opt/conda/lib without the libraries: the
#              runner falls back to USE_SMDDP_COLLECTIVES=0, and so do the ranks
#   v1         a script on SMDDP's API before 1.4 (smdistributed.dataparallel.
#              torch.distributed and its DDP) ends with auto's parameters
#   error      a script that misuses that API fails, and the toolkit names the
#              error class from smdistributed.dataparallel.exceptions
#   two-hosts  algo-1 and algo-2: the runner's mpirun across them; FI_PROVIDER=efa
#              without an EFA device falls back to tcp with one warning
#   toolkit-5  sagemaker-training 5.1.4 finds smddprun on PATH and runs it
#
#   test/sagemaker/run.sh BUILD_DIR WHEEL     (as root; WHEEL: the smddp wheel)
#
# The toolkits, mpi4py and the wheel go into two Python environments under
# BUILD_DIR/sagemaker, made at /opt/conda inside a mount namespace (the host's
# /opt is left as it was). Ends with "sagemaker: N passed, N failed".
set -uo pipefail

BUILD=${1:?usage: test/sagemaker/run.sh BUILD_DIR WHEEL}
WHEEL=${2:?usage: test/sagemaker/run.sh BUILD_DIR WHEEL}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$BUILD" || exit 1
WORK=$(cd "$BUILD" && pwd)/sagemaker
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
LIMIT=300   # seconds a host may run before it is killed
# shellcheck source=test/netns/lib.sh
. "$HERE/../netns/lib.sh"

die() { echo "sagemaker: $*" >&2; echo "sagemaker: 0 passed, 1 failed"; exit 1; }

[ "$(id -u)" = 0 ] || die "namespaces need root (running as uid $(id -u))"
for tool in ip unshare mpirun ssh ssh-keygen /usr/sbin/sshd; do
    command -v "$tool" >/dev/null || die "$tool is missing (.ci/deps installs it)"
done
[ -f "$WHEEL" ] || die "no wheel at $WHEEL (pip wheel --no-build-isolation --no-deps . -w DIR)"

trap ns_cleanup EXIT
trap 'exit 130' INT TERM

# make_env NAME TOOLKIT: a Python environment at /opt/conda (seen from a mount
# namespace) in $WORK/NAME, over this Python's (torch comes from there), with
# the toolkit, SageMaker's PyTorch container package, mpi4py and the wheel.
make_env() {
    local dir=$WORK/$1 toolkit=$2
    rm -rf "$dir"
    mkdir -p "$dir/conda"
    echo "torch==$($PY -c 'import torch; print(torch.__version__.split("+")[0])')" \
        >"$dir/constraints.txt"
    unshare --mount --propagation private bash -euc '
        . "$5"
        conda_at "$1/conda" "$1/opt"
        "$2" -m venv --system-site-packages /opt/conda
        /opt/conda/bin/pip install -q --disable-pip-version-check -c "$1/constraints.txt" \
            "$3" sagemaker-pytorch-training==2.7.0 mpi4py==4.1.2
        # --ignore-installed: the smddp of the Python below is the same version.
        /opt/conda/bin/pip install -q --disable-pip-version-check --no-deps --ignore-installed "$4"
    ' make_env "$dir" "$PY" "$toolkit" "$WHEEL" "$HERE/lib.sh" >"$dir.log" 2>&1
}

# ssh_keys: a key pair for the user and a host key, OpenSSH's daemon and
# client settings (all under $WORK/ssh/etc, bound at /etc/ssh, so that
# nothing reads the user's own ~/.ssh), a home whose .ssh holds the key for
# the toolkit's paramiko, and PAM's sshd stack with pam_loginuid optional, as
# SageMaker's images set them up for mpirun across hosts.
ssh_keys() {
    local d=$WORK/ssh
    rm -rf "$d"
    mkdir -p "$d/etc" "$d/home/.ssh"
    ssh-keygen -q -t ed25519 -N '' -C smddp-test -f "$d/etc/id_ed25519" || return 1
    cp "$d/etc/id_ed25519.pub" "$d/etc/authorized_keys"
    cp "$d/etc/id_ed25519" "$d/home/.ssh/id_ed25519"
    ssh-keygen -q -t ed25519 -N '' -f "$d/etc/ssh_host_ed25519_key" || return 1
    cat >"$d/etc/sshd_config" <<'CONF'
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile /etc/ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
StrictModes no
PidFile /run/sshd.pid
CONF
    printf 'Host *\n  IdentityFile /etc/ssh/id_ed25519\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' \
        >"$d/etc/ssh_config"
    chmod 600 "$d/etc/id_ed25519" "$d/home/.ssh/id_ed25519"
    sed 's/^session\s*required\s*pam_loginuid.so/session optional pam_loginuid.so/' \
        /etc/pam.d/sshd >"$d/pam.d-sshd"
}

# start_job NAME ENV PROGRAM BACKEND SSHD NODE...: one job, its hosts algo-1..
# on the given namespace nodes (SSHD: noop, or $WORK/ssh for OpenSSH's daemon), each host started in the background (pids in
# JOB_PIDS, output in $WORK/NAME/algo-<i>.log, exit status in algo-<i>.rc).
JOB_PIDS=()
start_job() {
    local name=$1 env=$2 program=$3 backend=$4 sshd=$5 hide=""
    shift 5
    [ "$name" = no-libs ] && hide=hide-libs
    local nodes=("$@") hosts=() addrs=() i
    for i in "${!nodes[@]}"; do
        hosts+=("algo-$((i + 1))")
        addrs+=("$(ns_addr "${nodes[$i]}")")
    done
    rm -rf "${WORK:?}/$name"
    for i in "${!nodes[@]}"; do
        local dir=$WORK/$name/${hosts[$i]}
        mkdir -p "$dir"
        $PY "$HERE/job.py" config "$dir" --hosts "$(IFS=,; echo "${hosts[*]}")" \
            --addrs "$(IFS=,; echo "${addrs[*]}")" --current "${hosts[$i]}" \
            --program "$program" --source "$HERE/code" ${backend:+--backend "$backend"} \
            || return 1
        {
            timeout -s KILL $LIMIT ip netns exec "$(ns_name "${nodes[$i]}")" unshare --mount \
                --uts --pid --fork --kill-child=SIGKILL --mount-proc --propagation private \
                bash "$HERE/host.sh" "$dir" "$WORK/$env/conda" "${hosts[$i]}" "$sshd" $hide \
                >"$dir.log" 2>&1
            echo $? >"$dir.rc"
        } &
        JOB_PIDS+=($!)
    done
}

mkdir -p "$WORK"
echo "== Python environments for the toolkits (pip) =="
make_env env-4 sagemaker-training==4.4.6 &
env4=$!
make_env env-5 sagemaker-training==5.1.4 &
env5=$!
wait $env4 || { tail -n 20 "$WORK/env-4.log"; die "installing sagemaker-training 4.4.6 failed"; }
wait $env5 || { tail -n 20 "$WORK/env-5.log"; die "installing sagemaker-training 5.1.4 failed"; }
ssh_keys || die "cannot make the SSH keys"
make_nodes 8 || die "cannot create network namespaces (needs root and iproute2)"

echo "== Jobs (hosts run in parallel; each runner sleeps 30 s after its job, as it does) =="
start_job two-hosts env-4 train_torch_smddp.py auto "$WORK/ssh" 0 1 || die "cannot start two-hosts"
start_job auto env-4 train_torch_smddp.py auto noop 2 || die "cannot start auto"
start_job nccl env-4 train_torch_smddp.py nccl noop 3 || die "cannot start nccl"
start_job v1 env-4 train_v1.py auto noop 4 || die "cannot start v1"
start_job toolkit-5 env-5 train_torch_smddp.py "" noop 5 || die "cannot start toolkit-5"
start_job no-libs env-4 train_torch_smddp.py auto noop 6 || die "cannot start no-libs"
start_job error env-4 train_error.py auto noop 7 || die "cannot start error"
for pid in "${JOB_PIDS[@]}"; do wait "$pid"; done

passed=0
failed=0
for job in auto nccl no-libs v1 error two-hosts toolkit-5; do
    if $PY "$HERE/job.py" check "$job" "$WORK"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
done
echo "sagemaker: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
