"""pytorch/examples mnist: single-GPU functions train(args, model, device, loader, ...)."""
from adapters.common import install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
