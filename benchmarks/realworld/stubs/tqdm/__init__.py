"""Tiny stand-in for tqdm: iterate, print nothing."""


class tqdm:
    def __init__(self, iterable=None, *a, **k):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def __len__(self):
        return len(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def update(self, *a, **k):
        pass

    def set_description(self, *a, **k):
        pass

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass

    @staticmethod
    def write(*a, **k):
        pass


def trange(*a, **k):
    return tqdm(range(*a))
