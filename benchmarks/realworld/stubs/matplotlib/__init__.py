"""Tiny stand-in for matplotlib (not installed here): use() and every pyplot call do
nothing, savefig included (no file is written)."""


def use(*a, **k):
    pass
