"""eriklindernoren/PyTorch-GAN implementations/infogan: generator and discriminator (three
heads), three optimizers -- one of them over itertools.chain(G, D) parameters --, .cuda()
under `if cuda:`, sampling of fixed codes to save_image."""
from adapters.common import install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "infogan.py")
