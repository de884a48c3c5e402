"""DDP201 sync-batchnorm-after-wrap."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, dotted
from ._base import Diagnostic, Rule


class SyncBatchNormAfterWrap(Rule):
    """
    ## What it does
    Reports `nn.SyncBatchNorm.convert_sync_batchnorm(model)` applied to a model
    that was already wrapped in DistributedDataParallel (earlier in the same
    function or module).

    ## Why is this bad?
    DDP registers its gradient hooks and buckets on the parameters of the module
    it wraps. Converting afterwards replaces the BatchNorm layers under the
    wrapper with new modules whose parameters DDP does not know: their
    gradients are not averaged, or DDP fails. Convert first, then wrap.

    ## Example
    ```python
    model = DDP(model, device_ids=[local_rank])
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ```

    ## Use instead
    ```python
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[local_rank])
    ```

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP201"
    NAME = "sync-batchnorm-after-wrap"
    SEVERITY = "warning"
    MESSAGE = "convert_sync_batchnorm after the DDP wrap: convert the model first, then wrap it"
    TRIGGERS = ("convert_sync_batchnorm",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        wraps = []
        for node in src.nodes:
            if isinstance(node, ast.Assign) and src.is_call(node.value, N.DDP):
                for target in node.targets:
                    wraps.append((dotted(target), src.function_of(node), node.lineno))
        for call in src.calls:
            if src.qualname(call.func) not in N.CONVERT_SYNC_BN or not call.args:
                continue
            arg = call.args[0]
            if src.is_call(arg, N.DDP):
                yield self.diagnostic(src, call)
                continue
            name = dotted(arg)
            scope = src.function_of(call)
            if any(w == name and s is scope and line < call.lineno for w, s, line in wraps):
                yield self.diagnostic(src, call)
