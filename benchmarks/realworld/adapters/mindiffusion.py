"""cloneofsimo/minDiffusion train_cifar10.py: DDPM wrapper module (mindiffusion/ddpm.py)
whose forward is the loss and whose .sample() runs the reverse chain, eps-model UNet in
mindiffusion/unet.py, device string default "cuda:1", loss EMA for display, per-epoch
samples and state_dict."""
from adapters.common import edit, install_probe, install_stub, sub


def adapt(root):
    for name in ("torchvision", "tqdm"):
        install_stub(root, ".", name)
    install_probe(root, "train_cifar10.py")
    edit(root, "train_cifar10.py",
         ("NaiveUnet(3, 3, n_feat=128), betas=(1e-4, 0.02), n_T=1000)",
          "NaiveUnet(3, 3, n_feat=16), betas=(1e-4, 0.02), n_T=20)"),
         ("    train_cifar10()", "    train_cifar10(n_epoch=2, device=\"cpu\")"))
    sub(root, "train_cifar10.py", r"batch_size=(per_rank_batch_size\()?512", r"batch_size=\g<1>16")
    sub(root, "train_cifar10.py", r"num_workers=16", "num_workers=0")
