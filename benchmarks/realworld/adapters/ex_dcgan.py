"""pytorch/examples dcgan: two models and two optimizers, functional data_parallel in
forward, checkpoints per epoch, fixed noise of batchSize."""
from adapters.common import install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
