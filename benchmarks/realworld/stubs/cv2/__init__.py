"""Tiny stand-in for OpenCV: importable, nothing more (the adapters give datasets that
never read or transform an image with it)."""


def __getattr__(name):
    raise AttributeError(f"rw stub cv2 has no {name}")
