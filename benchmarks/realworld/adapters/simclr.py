"""sthalles/SimCLR: trainer class in another module, InfoNCE built from args.batch_size,
AMP GradScaler, SummaryWriter whose log_dir every process uses, checkpoint at the end."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    for name in ("torchvision", "tqdm", "rw_tb"):
        install_stub(root, ".", name)
    install_probe(root, "run.py")
    edit(root, "simclr.py", ("from torch.utils.tensorboard import SummaryWriter",
                             "from rw_tb import SummaryWriter"))
