"""DDP306 ddp-forward-on-one-rank."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from .._analysis import Source, ddp_wrapped_names, dotted, on_main_process_only
from ._base import Diagnostic, Rule

_EVAL_FUNC = re.compile(r"(?i)(eval|valid|test|infer|predict|generate|sample|forward)")


class DDPForwardOnOneRank(Rule):
    """
    ## What it does
    Reports the DDP-wrapped model run on the main process only: called directly
    (`model(x)`) or handed to an evaluation function (`evaluate(model, ...)`,
    `validate(...)`, `test(...)`, `predict(...)`) or to a function of the file that
    runs it (`estimate_loss(model)` whose body calls `net(x)`), under `if rank == 0:`.

    ## Why is this bad?
    The wrapper's forward may talk to the other ranks (it broadcasts buffers such
    as BatchNorm statistics, and with some options synchronises parameters): if
    only rank 0 calls it, rank 0 waits for ranks that never come.

    ## Example
    ```python
    if dist.get_rank() == 0:
        accuracy = evaluate(model, val_loader)
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        accuracy = evaluate(model.module, val_loader)
    ```
    or evaluate on every rank over a sharded loader and all-reduce the sums.

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP306"
    NAME = "ddp-forward-on-one-rank"
    SEVERITY = "warning"
    MESSAGE = "the DDP model runs on the main process only: evaluate model.module there, or on every rank"
    TRIGGERS = ("DistributedDataParallel",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        wrapped = ddp_wrapped_names(src)
        if not wrapped:
            return
        forwarding = _functions_running_a_parameter(src)
        for call in src.calls:
            direct = dotted(call.func) in wrapped
            handed = (
                _EVAL_FUNC.search(dotted(call.func).rsplit(".", 1)[-1] or "")
                and any(dotted(a) in wrapped for a in call.args)
            ) or any(
                dotted(a) in wrapped and i in forwarding.get(dotted(call.func), ())
                for i, a in enumerate(call.args)
            )
            if (direct or handed) and on_main_process_only(src, call):
                name = dotted(call.func) if direct else next(dotted(a) for a in call.args if dotted(a) in wrapped)
                yield self.diagnostic(src, call, self.MESSAGE.replace("model.module", f"{name}.module"))


def _functions_running_a_parameter(src: Source) -> dict:
    """{function of this file: the positions of the parameters it calls}: nanoGPT's
    ``estimate_loss(net, loader)`` runs ``net(x)`` -- handed the DDP model, that is
    its forward, whatever the helper is called."""
    found = {}
    for func in src.tree.body:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
        called = {n.func.id for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        positions = {i for i, p in enumerate(params) if p in called}
        if positions:
            found[func.name] = positions
    return found
