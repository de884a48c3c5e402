def save_image(*a, **k):
    pass


def make_grid(t, *a, **k):
    return t
