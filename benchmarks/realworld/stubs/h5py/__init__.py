"""Tiny stand-in for h5py: File(path) reads nothing and gives synthetic float32 groups (values 0..255, as prepare.py stores).

A path whose name contains "eval" gives SRCNN-style evaluation groups (f['lr'][str(i)],
RW_NTEST images of 24x24); any other path a training file (f['lr'][i], RW_N patches of
RW_PATCH x RW_PATCH, default 17).  Same content for the same path on every process."""
import os
import zlib

import numpy as np


class File:
    def __init__(self, name, mode="r", **kw):
        rng = np.random.default_rng(zlib.crc32(os.path.basename(str(name)).encode()))
        if "eval" in os.path.basename(str(name)):
            n, s = int(os.environ.get("RW_NTEST", "4")), 24
            self._d = {k: {str(i): rng.integers(0, 256, (s, s)).astype(np.float32) for i in range(n)}
                       for k in ("lr", "hr")}
        else:
            n, s = int(os.environ.get("RW_N", "64")), int(os.environ.get("RW_PATCH", "17"))
            self._d = {k: rng.integers(0, 256, (n, s, s)).astype(np.float32) for k in ("lr", "hr")}

    def __getitem__(self, k):
        return self._d[k]

    def keys(self):
        return self._d.keys()

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
