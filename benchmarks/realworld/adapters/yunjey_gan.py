"""yunjey/pytorch-tutorial 03-advanced/generative_adversarial_network: module-level MNIST
GAN, G and D as nn.Sequential, two Adams, reset_grad() zeroing both, sample images per
epoch, G.ckpt/D.ckpt at the end."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
    edit(root, "main.py", ("num_epochs = 200", "num_epochs = 2"), ("batch_size = 100", "batch_size = 16"),
         ("hidden_size = 256", "hidden_size = 32"))
