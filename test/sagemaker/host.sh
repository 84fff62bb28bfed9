#!/usr/bin/env bash
# One SageMaker host, as a training container sees its machine, for
# test/sagemaker/run.sh. Started in a network namespace of its own and in
# new mount, UTS and PID namespaces:
#
#   ip netns exec NS unshare --mount --uts --pid --fork --kill-child=SIGKILL \
#       --mount-proc --propagation private bash host.sh DIR CONDA HOST SSH [hide-libs]
#
# It stands in for SageMaker's infrastructure only: the host name HOST; the
# image's conda prefix /opt/conda (CONDA, a Python environment created at
# that path); /opt/ml (DIR/opt_ml, with the config files SageMaker writes);
# /etc/hosts (DIR/hosts); and an SSH daemon, a no-op (SSH=noop: one host,
# nobody connects) or OpenSSH's own, as the images carry for mpirun across
# hosts, with this run's keys and settings (SSH: a folder with etc/ for
# /etc/ssh, pam.d-sshd, and home/, the user's home here, whose .ssh the
# toolkit's paramiko reads). hide-libs: /opt/conda/lib
# shows only its python3.* folders, as with an install that does not put
# libsmddp.so and libsmddpcoll.so there. /tmp, /run,
# /dev/shm and /etc/environment are private to the host. Then it runs the
# image's entry point, `train`, with the environment a container starts with.
set -euo pipefail
dir=$1 conda=$2 host=$3 ssh=$4 hide=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=test/sagemaker/lib.sh
. "$here/lib.sh"

hostname "$host"
conda_at "$conda" "$dir/opt"
mkdir -p /opt/ml
if [ "$hide" = hide-libs ]; then
    mount -t tmpfs tmpfs /opt/conda/lib
    for d in "$conda"/lib/python3*; do
        mkdir "/opt/conda/lib/${d##*/}"
        mount --bind "$d" "/opt/conda/lib/${d##*/}"
    done
fi
mount --bind "$dir/opt_ml" /opt/ml
mount --bind "$dir/hosts" /etc/hosts
: >"$dir/environment"
mount --bind "$dir/environment" /etc/environment
mount -t tmpfs tmpfs /run
mkdir -p /run/sshd
home=$HOME
if [ "$ssh" != noop ]; then
    mount --bind "$ssh/etc" /etc/ssh
    mount --bind "$ssh/pam.d-sshd" /etc/pam.d/sshd
    home=/run/home
    mkdir "$home"
    mount --bind "$ssh/home" "$home"
else
    mount --bind "$here/noop_sshd" /usr/sbin/sshd
fi
# Last: the folders above may lie under /tmp.
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm

cd /
exec env -i HOME="$home" PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 SAGEMAKER_TRAINING_MODULE=sagemaker_pytorch_container.training:main \
    /opt/conda/bin/train
