"""Tiny stand-in for torchvision (whose wheel does not match this torch): synthetic
datasets of RW_N samples, identity transforms, no-op image saving."""
from . import datasets, transforms, utils, models  # noqa
