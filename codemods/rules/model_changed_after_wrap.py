"""DDP202 model-changed-after-wrap."""

from __future__ import annotations

from typing import Iterator

from .. import _names as N
from .._analysis import UNFREEZE_ADVICE, Source, changes_after_wrap
from ._base import Diagnostic, Rule


class ModelChangedAfterWrap(Rule):
    """
    ## What it does
    Reports changes to a model's parameters after it was wrapped in
    DistributedDataParallel and before training starts (the first statement
    that calls `backward()`): a new layer assigned onto it
    (`model.module.fc = nn.Linear(...)`), `.half()`/`.float()`/`.bfloat16()`,
    `.apply(init_fn)`, `.requires_grad_()`, or `requires_grad` set in a loop over
    its parameters. Once training has started, a `requires_grad` switch that
    more training follows (unfreezing a backbone at epoch N) is reported too,
    unless the model is wrapped again after it. A model frozen after the wrap
    that no optimizer of the file steps (DINO's teacher) is not reported: no
    backward reaches it. Changes made through the module the wrap was built on
    (`net = DDP(core)`, then `core.head.apply(init)`) count too. The same recogniser runs in
    `dp2ddp convert`, on the DataParallel wraps it turns into DDP.

    ## Why is this bad?
    DDP registers its gradient hooks and buckets on the parameters it sees when
    it is built, and copies rank 0's values to every rank at that moment. A
    layer added afterwards gets no gradient averaging, weights initialised
    afterwards with each rank's own random numbers differ across ranks, and a
    dtype or `requires_grad` changed afterwards no longer matches its buckets:
    the replicas drift apart silently, or DDP fails at the first backward pass.
    DataParallel copied the model on every forward pass, so the same code worked
    there.

    ## Example
    ```python
    model = DDP(model, device_ids=[local_rank])
    for p in model.parameters():
        p.requires_grad = False
    model.module.fc = nn.Linear(512, 10)
    ```

    ## Use instead
    ```python
    for p in model.parameters():
        p.requires_grad = False
    model.fc = nn.Linear(512, 10)
    model = DDP(model.to(device), device_ids=[local_rank])
    ```

    ## Fix safety
    No automatic fix: moving the wrap past arbitrary code is for a human.
    """

    CODE = "DDP202"
    NAME = "model-changed-after-wrap"
    SEVERITY = "warning"
    MESSAGE = "the model is changed after the DDP wrap: DDP does not see the change; do it before wrapping"
    TRIGGERS = ("DistributedDataParallel",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for stmt, _, name, what in changes_after_wrap(src, N.DDP):
            yield self.diagnostic(
                src,
                stmt,
                f"{name} is changed after the DDP wrap ({what}): "
                + (
                    UNFREEZE_ADVICE if what.endswith("during training") else
                    "DDP does not see the change (no gradient averaging for new layers, ranks drift "
                    "apart); do it before wrapping"
                ),
            )
