"""pytorch/examples vae: module-level single-GPU script, summed loss, save_image samples."""
from adapters.common import install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
