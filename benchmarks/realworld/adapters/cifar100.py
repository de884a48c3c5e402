"""weiaicunzai/pytorch-cifar100: single-GPU, loaders built in utils.py, warm-up LR per
iteration, settings module, TensorBoard, checkpoint folder named by the start time."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    for name in ("torchvision", "rw_tb"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
    edit(root, "train.py", ("from torch.utils.tensorboard import SummaryWriter",
                            "from rw_tb import SummaryWriter"),
         ("num_workers=4", "num_workers=0"), count=None)
    edit(root, "conf/global_settings.py", ("EPOCH = 200", "EPOCH = 2"),
         ("MILESTONES = [60, 120, 160]", "MILESTONES = [0, 1, 2]"), ("SAVE_EPOCH = 10", "SAVE_EPOCH = 1"))
