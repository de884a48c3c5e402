"""Tiny stand-in for wandb (not installed here): init() gives a run whose config.update
and log do nothing (wandb.config, watch, save likewise); Histogram/Image wrap their argument."""


class _Config(dict):
    def update(self, d=(), **k):
        dict.update(self, vars(d) if hasattr(d, "__dict__") else d, **k)


class _Run:
    def __init__(self):
        self.config = _Config()

    def log(self, *a, **k):
        pass

    def finish(self):
        pass


run = None
config = _Config()  # module-level wandb.config, as after wandb.init()


def init(*a, **k):
    global run
    run = _Run()
    run.config = config
    return run


def watch(*a, **k):
    pass


def save(*a, **k):
    pass


def log(*a, **k):
    pass


class Histogram:
    def __init__(self, *a, **k):
        pass


class Image:
    def __init__(self, *a, **k):
        pass
