# What test/sagemaker/run.sh and host.sh do inside a mount namespace of
# their own, so that nothing they create reaches the host's folders.

# writable DIR SCRATCH: DIR as an overlay whose changes go to SCRATCH.
writable() {
    mkdir -p "$2/upper" "$2/work"
    mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/work" "$1"
}

# conda_at CONDA SCRATCH: the folder CONDA seen at /opt/conda, the Python
# prefix of SageMaker's training images (/opt made writable in SCRATCH).
conda_at() {
    writable /opt "$2"
    mkdir -p /opt/conda
    mount --bind "$1" /opt/conda
}
