import torch


def save_image(*a, **k):
    pass


def make_grid(t, *a, **k):
    """One image (C, H, W), like the real one: a batch is laid side by side."""
    if isinstance(t, (list, tuple)):
        t = torch.stack(list(t))
    return torch.cat(list(t), dim=-1) if t.dim() == 4 else t
