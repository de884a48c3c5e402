"""dp2ddp: migrate PyTorch DataParallel / single-GPU training scripts to DistributedDataParallel."""

__version__ = "0.1.0"
