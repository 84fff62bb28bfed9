"""SMDDP's TensorFlow API is not served: libsmddp is a PyTorch backend."""

from smdistributed.dataparallel.exceptions import SMDDPUnsupportedError

raise SMDDPUnsupportedError(
    "smdistributed.dataparallel.tensorflow is not provided by libsmddp, which serves PyTorch "
    "only (torch.distributed backend 'smddp'); for TensorFlow use tf.distribute's "
    "MultiWorkerMirroredStrategy or Horovod")
