"""eriklindernoren/PyTorch-GAN implementations/wgan_gp: module-level script, generator and
critic with two Adams, n_critic critic steps per generator step, gradient penalty through
torch.autograd.grad(create_graph=True) on the critic, save_image of samples."""
from adapters.common import install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "wgan_gp.py")
