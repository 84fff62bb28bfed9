"""smdistributed.dataparallel, served by libsmddp.

Scripts written for Amazon SageMaker's distributed data parallel library
(SMDDP) import this package; libsmddp provides it so that they run unchanged:

- ``smdistributed.dataparallel.torch.torch_smddp``: importing it registers the
  ``smddp`` backend for ``torch.distributed.init_process_group(backend="smddp")``
  (SMDDP 1.4 and later);
- ``smdistributed.dataparallel.torch.distributed`` and
  ``smdistributed.dataparallel.torch.parallel.DistributedDataParallel``: the
  API of SMDDP before 1.4, on top of torch.distributed and the smddp backend;
- ``smdistributed.dataparallel.exceptions``: the errors this package raises,
  which SageMaker's training toolkit looks up to classify a failed job.

``smdistributed`` itself is a namespace package, so other ``smdistributed.*``
distributions install beside this one.
"""

__version__ = "1.8.0"  # the SMDDP release whose PyTorch API this package follows
