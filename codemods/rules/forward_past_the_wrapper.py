"""DDP308 forward-past-the-wrapper."""

from __future__ import annotations

from typing import Iterator

from .._analysis import Source, ddp_wrapped_names, forward_past_the_wrapper
from ._base import Diagnostic, Rule


class ForwardPastTheWrapper(Rule):
    """
    ## What it does
    Reports a training step that runs the DDP-wrapped model, or a part of it,
    through `.module` (`model.module(x)`, `model.module.encoder(x)`) where a
    `backward()` follows: in its loop, or later in its function.

    ## Why is this bad?
    DDP averages the gradients of the parameters used by *its own* forward pass
    (its hooks are armed there). A forward that goes past the wrapper leaves
    each rank with its own gradients: the replicas drift apart, silently. Under
    DataParallel, `model.module.encoder(x)` only lost the multi-GPU split, so
    the same code used to train correctly.

    ## Example
    ```python
    z = model.module.projector(model.module.encoder(x))
    loss = criterion(z, target)
    loss.backward()
    ```

    ## Use instead
    Call the wrapped model (`model(x)`); if a training step needs several parts,
    return them from the model's `forward` (or wrap a module that runs them).

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP308"
    NAME = "forward-past-the-wrapper"
    SEVERITY = "error"
    MESSAGE = "a training step runs the model past its DDP wrapper: its gradients are not averaged"
    TRIGGERS = ("DistributedDataParallel",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        wrapped = ddp_wrapped_names(src)
        if not wrapped:
            return
        for stmt, name in forward_past_the_wrapper(src, wrapped):
            yield self.diagnostic(
                src, stmt,
                f"{name}(...) runs the model past its DDP wrapper in a training step: DDP does not "
                "average these gradients and the ranks drift apart; call the wrapped model instead "
                "(return the parts you need from its forward)",
            )
