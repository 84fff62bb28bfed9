"""smdistributed.dataparallel for PyTorch: see torch_smddp, distributed and parallel."""
