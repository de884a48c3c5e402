"""Every transform is the identity on tensors (ToTensor turns a number list into one)."""
import torch


class _Identity:
    def __init__(self, *a, **k):
        pass

    def __call__(self, x):
        return x


class Compose:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self, x):
        for t in self.ts:
            x = t(x)
        return x


class ToTensor(_Identity):
    def __call__(self, x):
        return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def __getattr__(name):
    return _Identity


import sys as _sys  # noqa: E402

transforms = _sys.modules[__name__]  # `from torchvision.transforms import transforms`
