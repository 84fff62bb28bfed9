"""Runnable examples: ``python -m smddp.examples.train_ddp`` trains a DDP model."""
