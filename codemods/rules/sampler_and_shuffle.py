"""DDP106 sampler-and-shuffle."""

from __future__ import annotations

from typing import Iterator

from .. import _names as N
from .._analysis import Source, argument, is_none, is_true, unpacked_keyword
from ._base import Diagnostic, Rule


class SamplerAndShuffle(Rule):
    """
    ## What it does
    Reports a `DataLoader` given both a `sampler=` and `shuffle=True`.

    ## Why is this bad?
    `DataLoader` raises `ValueError: sampler option is mutually exclusive with
    shuffle` when it is built: the shuffling belongs to the sampler
    (`DistributedSampler(dataset, shuffle=True)`).

    ## Example
    ```python
    DataLoader(train_set, sampler=DistributedSampler(train_set), shuffle=True)
    ```

    ## Use instead
    ```python
    DataLoader(train_set, sampler=DistributedSampler(train_set, shuffle=True))
    ```

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP106"
    NAME = "sampler-and-shuffle"
    SEVERITY = "error"
    MESSAGE = "DataLoader with sampler= and shuffle=True raises ValueError: move shuffle into the sampler"
    TRIGGERS = (("shuffle", "sampler"),)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for call in src.calls:
            if src.qualname(call.func) not in N.DATA_LOADER:
                continue
            sampler = argument(call, 3, "sampler")
            if sampler is None:
                sampler = unpacked_keyword(src, call, "sampler")
            if sampler is None or is_none(sampler):
                continue
            shuffle = argument(call, 2, "shuffle")
            if is_true(shuffle if shuffle is not None else unpacked_keyword(src, call, "shuffle")):
                yield self.diagnostic(src, call)
