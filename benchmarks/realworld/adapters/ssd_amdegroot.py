"""amdegroot/ssd.pytorch: SSD300 detection, train() function, DataParallel under
`if args.cuda:` wrapped *before* the base VGG weights are loaded and the extra/head
layers are xavier-initialised through the inner module (ssd_net), iteration-based loop
over one iter(data_loader) with next(), detection_collate (a list of box tensors per
batch), lr steps by iteration, final ssd_net.state_dict() save."""
import subprocess
import sys
from pathlib import Path

from adapters.common import append, cuda_on_cpu, edit, install_probe, install_stub

DATA = '''

class RWDetData(torch.utils.data.Dataset):
    """rw harness: RW_N random 3x300x300 images with 1-3 boxes each (x1,y1,x2,y2,label)."""
    name = "RW"

    def __init__(self, *a, **k):
        import os
        n = int(os.environ.get("RW_N", "8"))
        g = torch.Generator().manual_seed(1)
        self.img = torch.rand(n, 3, 300, 300, generator=g)
        self.boxes = []
        for i in range(n):
            k = 1 + i % 3
            xy = torch.rand(k, 2, generator=g) * 0.5
            wh = 0.2 + torch.rand(k, 2, generator=g) * 0.3
            lab = torch.randint(0, 20, (k, 1), generator=g).float()
            self.boxes.append(torch.cat([xy, xy + wh, lab], 1).numpy())

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        return self.img[i], self.boxes[i]
'''

VGG = ("import torch, torch.nn as nn; torch.manual_seed(0); from ssd import vgg, base; "
       "torch.save(nn.ModuleList(vgg(base['300'], 3)).state_dict(), 'weights/vgg16_reducedfc.pth')")


def adapt(root):
    for name in ("torchvision", "cv2"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
    cuda_on_cpu(root, "train.py")
    append(root, "data/__init__.py", DATA)
    # importing data.coco reads COCO_ROOT/coco_labels.txt: the copy shipped in data/
    edit(root, "data/coco.py", ("COCO_ROOT = osp.join(HOME, 'data/coco/')",
                                "COCO_ROOT = osp.dirname(osp.abspath(__file__))"))
    edit(root, "train.py",
         ("dataset = VOCDetection(root=args.dataset_root,\n"
          "                               transform=SSDAugmentation(cfg['min_dim'],\n"
          "                                                         MEANS))", "dataset = RWDetData()"),
         (".data[0]", ".item()"), count=None)
    # a few iterations (no more than one pass: the original's single iter() would stop)
    edit(root, "data/config.py", ("'max_iter': 120000,", "'max_iter': int(os.environ.get('RW_ITERS', '4')),"))
    # modern torch: the boolean mask must match loss_c's shape (the upstream fix, issue #173)
    edit(root, "layers/modules/multibox_loss.py",
         ("        loss_c[pos] = 0  # filter out pos boxes for now\n        loss_c = loss_c.view(num, -1)\n",
          "        loss_c = loss_c.view(num, -1)\n        loss_c[pos] = 0  # filter out pos boxes for now\n"))
    # a small SSD: channel widths / 8
    edit(root, "ssd.py",
         ("'300': [64, 64, 'M', 128, 128, 'M', 256, 256, 256, 'C', 512, 512, 512, 'M',\n            512, 512, 512],",
          "'300': [8, 8, 'M', 16, 16, 'M', 32, 32, 32, 'C', 64, 64, 64, 'M',\n            64, 64, 64],"),
         ("'300': [256, 'S', 512, 128, 'S', 256, 128, 256, 128, 256],",
          "'300': [32, 'S', 64, 16, 'S', 32, 16, 32, 16, 32],"),
         ("nn.Conv2d(512, 1024, kernel_size=3, padding=6, dilation=6)", "nn.Conv2d(64, 128, kernel_size=3, padding=6, dilation=6)"),
         ("nn.Conv2d(1024, 1024, kernel_size=1)", "nn.Conv2d(128, 128, kernel_size=1)"),
         ("L2Norm(512, 20)", "L2Norm(64, 20)"),
         ("add_extras(extras[str(size)], 1024)", "add_extras(extras[str(size)], 128)"))
    # the pretrained base network (--basenet): random weights of the small VGG's shapes
    Path(root, "weights").mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-c", VGG], cwd=root, check=True)
