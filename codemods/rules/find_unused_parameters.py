"""DDP204 find-unused-parameters."""

from __future__ import annotations

from typing import Iterator

from .. import _names as N
import ast

from .._analysis import Source, discarded_outputs, dotted, inputs_dropped_in_training, is_true, keyword
from ._base import Diagnostic, Rule


class FindUnusedParameters(Rule):
    """
    ## What it does
    Reports `DistributedDataParallel(..., find_unused_parameters=True)` -- unless
    a training step drops some of the wrapped model's outputs (`validity, _ =
    d(x)` before a `backward()`), or hands it an input it sets to None in some
    steps (`if random() < 0.1: labels = None` before `model(x, labels)`, where
    `forward` tests it: classifier-free guidance): the layers behind them are
    unused there.

    Off by default: on the lint set of real DDP repositories too many of its
    findings were models that do leave parameters unused, through flags inside
    the model that it cannot see; select it (`--extend-select DDP204`) to see them.

    ## Why is this bad?
    With it DDP walks the autograd graph after every forward to find the
    parameters that got no gradient: a cost on every step, needed only when some
    parameters really are unused in some steps. Scripts often keep it from a
    copied example or to silence an error once.

    ## Example
    ```python
    model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)
    ```

    ## Use instead
    ```python
    model = DDP(model, device_ids=[local_rank])
    ```
    or, if the set of used parameters never changes, `static_graph=True`; freeze
    parameters that are never used (`requires_grad_(False)`).

    ## Fix safety
    No automatic fix: only the author knows whether parameters go unused.
    """

    # off by default: on the lint set 3 of its 5 judged findings were true (60%); the false
    # ones were models whose forward leaves parameters unused by flags inside the model
    DEFAULT = False
    CODE = "DDP204"
    NAME = "find-unused-parameters"
    SEVERITY = "warning"
    MESSAGE = "find_unused_parameters=True walks the graph every step: drop it, or use static_graph=True / freeze unused parameters"
    TRIGGERS = ("find_unused_parameters",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for call in src.calls:
            if src.qualname(call.func) in N.DDP:
                value = keyword(call, "find_unused_parameters")
                if is_true(value) and not self._needed(src, call):
                    yield self.diagnostic(src, value)

    @staticmethod
    def _needed(src: Source, call) -> bool:
        """The wrapped model drops some of its outputs in a training step
        (``discarded_outputs``), or is handed an input set to None in some steps
        (``inputs_dropped_in_training``): its unused parameters are real."""
        parent = src.parent(call)
        targets = parent.targets if isinstance(parent, ast.Assign) else []
        return any(
            # (the forward may be in another module: an input set to None on some steps is enough)
            discarded_outputs(src, dotted(t)) or inputs_dropped_in_training(src, dotted(t), forward_elsewhere=True)
            for t in targets
        )
