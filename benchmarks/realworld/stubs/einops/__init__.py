"""Tiny stand-in for einops (not installed here): importable only; the models that
use it are not run by the adapters."""


def _absent(*a, **k):
    raise NotImplementedError("stubs/einops: not available")


rearrange = repeat = reduce = _absent
