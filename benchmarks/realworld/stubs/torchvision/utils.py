import os

import torch


def save_image(tensor, fp=None, *a, **k):
    """No-op; with RW_SAVE_IMAGE=1 it writes a small file at fp like the real one
    (so the probe sees who writes each image path)."""
    if os.environ.get("RW_SAVE_IMAGE") == "1" and isinstance(fp, (str, os.PathLike)):
        with open(fp, "wb") as f:
            f.write(b"rw image\n")


def make_grid(t, *a, **k):
    """One image (C, H, W), like the real one: a batch is laid side by side."""
    if isinstance(t, (list, tuple)):
        t = torch.stack(list(t))
    return torch.cat(list(t), dim=-1) if t.dim() == 4 else t
