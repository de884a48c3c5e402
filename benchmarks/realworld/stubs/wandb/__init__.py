"""Tiny stand-in for wandb (not installed here): init() gives a run whose config.update
and log do nothing; Histogram/Image wrap their argument."""


class _Config(dict):
    def update(self, *a, **k):
        dict.update(self, *a, **k)


class _Run:
    def __init__(self):
        self.config = _Config()

    def log(self, *a, **k):
        pass

    def finish(self):
        pass


def init(*a, **k):
    return _Run()


def log(*a, **k):
    pass


class Histogram:
    def __init__(self, *a, **k):
        pass


class Image:
    def __init__(self, *a, **k):
        pass
