"""Tiny stand-in for pandas (not installed here): DataFrame(data=dict of columns,
index=...).to_csv(path) writes a plain CSV through open()."""


class DataFrame:
    def __init__(self, data=None, index=None, **k):
        self.data = dict(data or {})
        n = max((len(v) for v in self.data.values()), default=0)
        self.index = list(index) if index is not None else list(range(n))

    def to_csv(self, path, index_label="", **k):
        with open(path, "w") as f:
            f.write(",".join([index_label or ""] + list(self.data)) + "\n")
            for i, ix in enumerate(self.index):
                f.write(",".join([str(ix)] + [str(v[i]) for v in self.data.values()]) + "\n")
