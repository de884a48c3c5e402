import os

import torch


class _Synthetic(torch.utils.data.Dataset):
    shape = (3, 32, 32)
    classes_n = 10

    def __init__(self, root=None, train=True, download=False, transform=None,
                 target_transform=None, split=None, **kw):
        n = int(os.environ.get("RW_N", "64")) if train else int(os.environ.get("RW_NTEST", "32"))
        g = torch.Generator().manual_seed(1 if train else 2)
        shape = tuple(int(v) for v in os.environ["RW_SHAPE"].split(",")) if "RW_SHAPE" in os.environ else self.shape
        self.data = torch.rand((n,) + shape, generator=g)
        self.targets = torch.randint(0, self.classes_n, (n,), generator=g).tolist()
        self.transform, self.target_transform = transform, target_transform
        self.classes = [str(i) for i in range(self.classes_n)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i], self.targets[i]
        if self.transform is not None:
            x = self.transform(x)
        if self.target_transform is not None:
            y = self.target_transform(y)
        return x, y


class CIFAR10(_Synthetic):
    pass


class CIFAR100(_Synthetic):
    classes_n = 100


class MNIST(_Synthetic):
    shape = (1, 28, 28)


FashionMNIST = MNIST


class STL10(_Synthetic):
    shape = (3, 32, 32)


class ImageFolder(_Synthetic):
    def __init__(self, root=None, transform=None, **kw):
        super().__init__(root, True, transform=transform)
