"""The errors of smdistributed.dataparallel.

SageMaker's training toolkit lists the classes of this module by name and
looks for those names in a failed job's output to say why it failed: only
this package's own classes are defined here.
"""


class SMDDPError(RuntimeError):
    """A collective or a call of smdistributed.dataparallel's API failed.

    Failures of libsmddp itself (a timeout, a rank that died) keep its
    message, which names the operation and the ranks involved.
    """


class SMDDPUnsupportedError(SMDDPError, NotImplementedError):
    """An argument or API smdistributed.dataparallel does not support here; the
    message says what to use instead."""
