"""DDP203 accumulation-without-no-sync."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from .._analysis import Source, calls_method, dotted, uses_distributed
from .._program import imported_by_ddp_code
from ._base import Diagnostic, Rule


class AccumulationWithoutNoSync(Rule):
    """
    ## What it does
    In DDP code, reports a gradient-accumulation loop -- `backward()` on every
    iteration, `optimizer.step()` only under a condition -- that never enters
    `model.no_sync()`.

    ## Why is this bad?
    Every `backward()` of a DDP model all-reduces the gradients across the
    processes. With accumulation only the last micro-step before the optimizer
    step needs it; the others waste communication (often most of the step time
    on several machines). The result is the same either way.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accum == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = criterion(model(x), y) / accum
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe: the averaged gradients are the same; only the communication changes.
    """

    CODE = "DDP203"
    NAME = "accumulation-without-no-sync"
    SEVERITY = "warning"
    MESSAGE = "gradient accumulation without model.no_sync(): every micro-step all-reduces the gradients"
    FIX = "safe"
    FIX_TRANSFORMS = ("no-sync-accumulation",)
    FIX_DESCRIPTION = "run the non-final micro-steps inside model.no_sync()"
    TRIGGERS = (("backward", "istributed"), ("backward", "step"), ("update_grad",))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        ddp_code: Optional[bool] = None  # (asked only where a loop accumulates)
        for loop in src.nodes:
            if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
                continue
            if calls_method(loop, "no_sync"):
                continue
            body = loop.body
            backward = next((i for i, s in enumerate(body) if _is_backward(s)), None)
            scaled = None if backward is not None else _scaler_accumulation(src, loop)
            if not (backward is not None and accumulates(loop) or scaled is not None):
                continue
            if ddp_code is None:
                # the DDP program: this file, or one that imports it (``engine.py``'s
                # train_one_epoch, called by ``main.py`` with the DDP model)
                ddp_code = uses_distributed(src) or imported_by_ddp_code(src)
            if ddp_code:
                found = self.diagnostic(src, body[backward] if backward is not None else scaled)
                if scaled is not None:
                    found.fix = None  # (the backward is in the helper: no_sync goes around the call, by hand)
                yield found


def accumulates(loop: ast.AST) -> bool:
    """``loop`` accumulates gradients: a ``backward()`` in its body, and after it
    an ``if`` that steps an optimizer -- unless an optimizer is stepped on every
    iteration anyway (every backward is then followed by a step), or the ``if``
    only tests that the optimizers it steps exist (``if enc_opt is not None:
    enc_opt.step()``, an optional optimizer stepped every batch).  One decision
    for lint and convert's no-sync-accumulation."""
    body = getattr(loop, "body", [])
    backward = next((i for i, s in enumerate(body) if _is_backward(s)), None)
    if backward is None:
        return False
    after = body[backward + 1 :]
    if any(not isinstance(s, ast.If) and _steps_now(s) for s in after):
        return False  # (a step every iteration)
    varying = _bound_in(loop)
    return any(
        isinstance(s, ast.If) and _steps(s) and not _exists_test(s) and _varies(s.test, varying) for s in after
    )


def _bound_in(loop: ast.AST) -> set:
    """The names the loop binds: its target and what its body assigns (counters,
    the batch), and ``self.`` attributes it assigns."""
    bound = set()
    for node in ast.walk(loop):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            bound.add(dotted(node))
        elif isinstance(node, ast.AugAssign):
            bound.add(dotted(node.target))
    return bound


def _varies(test: ast.AST, varying: set) -> bool:
    """``test`` can change from one iteration to the next: it reads a name the loop
    binds (``(i + 1) % accum == 0``) or calls something.  ``if args.use_optimizer:``
    is the same on every iteration -- a step on each of them or on none, not
    gradient accumulation."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call):
            return True
        if isinstance(node, ast.Name) and node.id in varying:
            return True
        if isinstance(node, ast.Attribute) and dotted(node) in varying:
            return True
    return False


def _steps_now(stmt: ast.stmt) -> bool:
    """``optimizer.step()`` as a statement of its own (not under a condition)."""
    return isinstance(stmt, ast.Expr) and _steps(ast.If(test=ast.Constant(True), body=[stmt], orelse=[]))


def _exists_test(node: ast.If) -> bool:
    """``if opt is not None:`` / ``if opt:`` (also joined by ``and``) over the
    optimizers the branch steps: true on every iteration or on none."""
    stepped = {
        dotted(sub.func.value)
        for sub in ast.walk(ast.Module(body=node.body, type_ignores=[]))
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "step"
    }
    tests = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) else [node.test]
    for test in tests:
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot) and (
            isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
        ):
            test = test.left
        if not dotted(test) or dotted(test) not in stepped:
            return False
    return True


def _scaler_accumulation(src: Source, loop: ast.AST) -> Optional[ast.stmt]:
    """``loss_scaler(loss, optimizer, update_grad=(i + 1) % accum_iter == 0)`` in the
    loop's body (MAE's and timm's NativeScaler: ``backward()`` and the step run in
    the helper, the step only when ``update_grad``): the statement, when its
    ``update_grad`` changes from one iteration to the next."""
    varying = _bound_in(loop)
    for stmt in getattr(loop, "body", []):
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        if call is None:
            continue
        update = next((k.value for k in call.keywords if k.arg in ("update_grad", "update", "step")), None)
        if update is not None and _varies(update, varying) and not isinstance(update, ast.Constant):
            return stmt
    return None


def _is_backward(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "backward"
    )


def _steps(node: ast.If) -> bool:
    for sub in ast.walk(ast.Module(body=node.body, type_ignores=[])):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "step":
            owner = dotted(sub.func.value).lower()
            if "opt" in owner or "scaler" in owner:
                return True
    return False
