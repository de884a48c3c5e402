"""pytorch/examples mnist_forward_forward: no end-to-end backward; each Layer (an
nn.Linear) owns an Adam and trains itself for `epochs` steps on one full batch taken with
next(iter(train_loader)); the layers sit in a plain list (Net has no parameters)."""
from adapters.common import install_probe, install_stub


def adapt(root):
    install_stub(root, ".")  # Lambda(flatten) is the identity there: RW_SHAPE=784
    install_probe(root, "main.py")
