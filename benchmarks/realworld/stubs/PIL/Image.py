import builtins as _builtins

import numpy as _np


class Image:
    pass


class _Array(_np.ndarray):
    """The array itself, plus save(): writes an empty file (so the probe sees the writer)."""

    def save(self, path, *a, **k):
        with _builtins.open(path, "wb"):
            pass


def fromarray(a, *args, **k):
    return _np.asarray(a).view(_Array)


def open(path, *a, **k):
    raise OSError("stubs/PIL: no image files here")
