"""peterliht/knowledge-distillation-pytorch mnist/distill_mnist.py: module-level script,
a frozen teacher MLP loaded from teacher_MLP.pth.tar (never wrapped, never stepped) and a
student trained on a KD loss; an eval pass over the *training* loader every epoch, a
final state_dict save."""
from pathlib import Path

import torch

from adapters.common import edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "distill_mnist.py")
    # pre-0.4 `.data[0]` on a 0-d loss stops the original (both trees alike)
    edit(root, "distill_mnist.py", ("loss.data[0]", "loss.item()"),
         ("F.cross_entropy(output, target).data[0]", "F.cross_entropy(output, target).item()"), count=None)
    # the pretrained teacher (teacher_mnist.py's output): random weights of its shapes
    g = torch.Generator().manual_seed(3)
    sd = {}
    for name, (o, i) in (("fc1", (1200, 784)), ("fc2", (1200, 1200)), ("fc3", (10, 1200))):
        sd[name + ".weight"] = torch.randn(o, i, generator=g) * 0.03
        sd[name + ".bias"] = torch.zeros(o)
    torch.save(sd, Path(root) / "teacher_MLP.pth.tar")
