"""kuangliu/pytorch-retinanet: RetinaNet (FPN50 + focal loss) detection, module-level
train.py, DataParallel(device_ids=range(device_count())) then .cuda(), loss modules
calling .cuda() inside forward (loss.py), dataset collate_fn encoding boxes into anchor
targets, pretrained model/net.pth loaded before wrapping, net.module.freeze_bn(),
best-test-loss checkpoint with mkdir, --resume."""
import subprocess
import sys
from pathlib import Path

from adapters.common import append, cuda_on_cpu, edit, install_probe, install_stub, sub

DATA = '''


class ListDataset(ListDataset):
    """rw harness: RW_N random images (input_size^2) with 1-3 boxes that match a
    p3 anchor exactly, so every image has positives; the upstream collate_fn encodes."""

    def __init__(self, root, list_file, train, transform, input_size):
        n = int(os.environ.get("RW_N", "16"))
        self.train, self.transform, self.input_size = train, transform, input_size
        self.encoder = DataEncoder()
        g = torch.Generator().manual_seed(1 if train else 2)
        self.img = torch.rand(n, 3, input_size, input_size, generator=g)
        self.boxes, self.labels = [], []
        for i in range(n):
            k = 1 + i % 3
            xy = (torch.randint(0, (input_size - 32) // 8, (k, 2), generator=g) * 8 + 4).float()
            self.boxes.append(torch.cat([xy, xy + 32], 1))
            self.labels.append(torch.randint(0, 20, (k,), generator=g))
        self.num_samples = n

    def __getitem__(self, idx):
        return self.img[idx], self.boxes[idx].clone(), self.labels[idx]
'''

NET = ("import torch; torch.manual_seed(0); from retinanet import RetinaNet; "
       "torch.save(RetinaNet().state_dict(), 'model/net.pth')")


def adapt(root):
    for name in ("torchvision", "PIL"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
    cuda_on_cpu(root, "train.py")  # also covers loss.py's .cuda() (a process-wide patch)
    sub(root, "train.py", r"^assert torch\.cuda\.is_available\(\), 'Error: CUDA not found!'\n", "")
    append(root, "datagen.py", DATA)
    edit(root, "train.py", ("input_size=600", "input_size=64"), ("num_workers=8", "num_workers=0"), count=2)
    edit(root, "train.py", (".data[0]", ".item()"), count=None)
    edit(root, "loss.py", (".data[0]", ".item()"), count=None)
    edit(root, "train.py", ("start_epoch+200", "start_epoch+2"))
    # utils.py asks the terminal for its width at import
    edit(root, "utils.py", ("_, term_width = os.popen('stty size', 'r').read().split()",
                            "term_width = '80'"))
    # a small FPN: one bottleneck per stage
    edit(root, "fpn.py", ("return FPN(Bottleneck, [3,4,6,3])", "return FPN(Bottleneck, [1,1,1,1])"))
    # the pretrained model (./model/net.pth): random weights of the small net
    Path(root, "model").mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-c", NET], cwd=root, check=True)
