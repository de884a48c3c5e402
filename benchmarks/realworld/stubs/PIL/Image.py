class Image:
    pass


def fromarray(a, *args, **k):
    return a


def open(path, *a, **k):
    raise OSError("stubs/PIL: no image files here")
