"""milesial/Pytorch-UNet: segmentation, train_model() function with a split dataset
(random_split), AMP autocast + GradScaler with unscale_ and clipping, evaluation rounds
inside the epoch (ReduceLROnPlateau on Dice), wandb, per-epoch checkpoints with extra keys."""
from adapters.common import append, edit, install_probe, install_stub

DATA = '''

class RWSegData(Dataset):
    """rw harness: RW_N random 3x32x32 images with 2-class masks."""

    def __init__(self, *a, **k):
        import os
        n = int(os.environ.get("RW_N", "16"))
        g = torch.Generator().manual_seed(1)
        self.img = torch.rand(n, 3, 32, 32, generator=g)
        self.mask = torch.randint(0, 2, (n, 32, 32), generator=g)
        self.mask_values = [0, 1]

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        return {"image": self.img[i], "mask": self.mask[i]}
'''


def adapt(root):
    for name in ("torchvision", "tqdm", "wandb", "PIL"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
    append(root, "utils/data_loading.py", DATA)
    edit(root, "train.py",
         ("from utils.data_loading import BasicDataset, CarvanaDataset",
          "from utils.data_loading import BasicDataset, CarvanaDataset, RWSegData"),
         ("dataset = CarvanaDataset(dir_img, dir_mask, img_scale)", "dataset = RWSegData()"),
         ("num_workers=os.cpu_count()", "num_workers=0"),
         ("import torchvision.transforms.functional as TF\n", ""))  # unused; the stub has no submodules
    # a small UNet: channel widths / 8
    edit(root, "unet/unet_model.py",
         ("DoubleConv(n_channels, 64)", "DoubleConv(n_channels, 8)"), ("Down(64, 128)", "Down(8, 16)"),
         ("Down(128, 256)", "Down(16, 32)"), ("Down(256, 512)", "Down(32, 64)"),
         ("Down(512, 1024 // factor)", "Down(64, 128 // factor)"),
         ("Up(1024, 512 // factor, bilinear)", "Up(128, 64 // factor, bilinear)"),
         ("Up(512, 256 // factor, bilinear)", "Up(64, 32 // factor, bilinear)"),
         ("Up(256, 128 // factor, bilinear)", "Up(32, 16 // factor, bilinear)"),
         ("Up(128, 64, bilinear)", "Up(16, 8, bilinear)"), ("OutConv(64, n_classes)", "OutConv(8, n_classes)"))
