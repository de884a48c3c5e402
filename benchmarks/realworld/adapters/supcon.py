"""HobbitLong/SupContrast main_supcon.py: SupConResNet whose *encoder* alone is put in
DataParallel (model.encoder = DataParallel(model.encoder), projection head outside) under
`if torch.cuda.is_available()`, loaders/model/optimizer built in helpers (set_loader,
set_model, util.set_optimizer), TwoCropTransform, SupConLoss, tensorboard_logger,
save_model in util.py every --save_freq epochs and last.pth."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    for name in ("torchvision", "tensorboard_logger"):
        install_stub(root, ".", name)
    install_probe(root, "main_supcon.py")
