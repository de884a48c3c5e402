"""DDP303 ddp-wrapper-state-dict."""

from __future__ import annotations

import ast
from typing import Iterator, Set

from .. import _names as N
from .._analysis import Source, dotted, ddp_wrapped_names
from .._program import loads_what_it_is_handed
from ._base import Diagnostic, Rule


class DDPWrapperStateDict(Rule):
    """
    ## What it does
    Reports a checkpoint saved (`torch.save`, directly or through a dict) from the
    `state_dict()` of a DistributedDataParallel wrapper, unless this file also
    loads it back into a DDP wrapper (a consistent round trip), itself or through a
    helper, of this file or a module it imports, that calls `load_state_dict` on
    what it is handed (`restart_from_checkpoint(path, state_dict=model)`).

    ## Why is this bad?
    The wrapper's keys carry a `module.` prefix (`module.fc.weight`). Loading the
    checkpoint into a bare model -- for evaluation, export, fine-tuning or a
    single-GPU run -- fails with missing and unexpected keys.

    ## Example
    ```python
    torch.save(model.state_dict(), "model.pt")  # model = DDP(...)
    ```

    ## Use instead
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Fix safety
    Unsafe: the checkpoint's key format changes; code that loads it into a DDP
    wrapper must load into `model.module` instead.
    """

    CODE = "DDP303"
    NAME = "ddp-wrapper-state-dict"
    SEVERITY = "warning"
    MESSAGE = "the DDP wrapper's state_dict() has 'module.'-prefixed keys: save model.module.state_dict()"
    FIX = "unsafe"
    FIX_TRANSFORMS = ("module-access",)
    FIX_DESCRIPTION = "save model.module.state_dict()"
    TRIGGERS = (("state_dict", "DistributedDataParallel"),)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        wrapped = ddp_wrapped_names(src)
        if not wrapped:
            return
        wraps = [
            (dotted(t), a.lineno, src.function_of(a))
            for a in src.of_type(ast.Assign) if src.is_call(a.value, N.DDP) for t in a.targets
        ]
        if any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "load_state_dict"
            and any(  # (a load into the bare model before its wrap is no round trip)
                dotted(c.func.value) == name and (c.lineno > line or src.function_of(c) is not where)
                for name, line, where in wraps
            )
            for c in src.calls
        ):
            return  # saved and loaded through the wrapper: consistent
        if any(
            any(dotted(arg) == name for arg in (*c.args, *(k.value for k in c.keywords)) for name, _, _ in wraps)
            and loads_what_it_is_handed(src, c)
            for c in src.calls
        ):
            return  # ``utils.restart_from_checkpoint(path, state_dict=model)`` loads it into the wrapper
        saved = _saved_names(src)
        for call in src.calls:
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "state_dict"):
                continue
            if dotted(call.func.value) not in wrapped:
                continue
            if _unwrapped_branch(src, call, dotted(call.func.value)):
                continue  # ``m.module.state_dict() if hasattr(m, "module") else m.state_dict()``
            if _feeds_save(src, call, saved):
                name = dotted(call.func.value)
                yield self.diagnostic(src, call, self.MESSAGE.replace("model.module", f"{name}.module"))


def _saved_names(src: Source) -> Set[str]:
    return {
        dotted(c.args[0]) for c in src.calls if src.qualname(c.func) in N.TORCH_SAVE and c.args and dotted(c.args[0])
    }


def _feeds_save(src: Source, call: ast.Call, saved: Set[str]) -> bool:
    for anc in src.ancestors(call):
        if isinstance(anc, ast.Call) and src.qualname(anc.func) in N.TORCH_SAVE:
            return True
        if isinstance(anc, ast.Assign):
            return any(dotted(t) in saved for t in anc.targets)
        if isinstance(anc, ast.stmt):
            return False
    return False


def _unwrapped_branch(src: Source, node: ast.AST, name: str) -> bool:
    """``node`` is in the branch for a model that is not wrapped: the ``else`` of a
    test ``hasattr(name, "module")`` / ``isinstance(name, DistributedDataParallel)``."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.IfExp, ast.If)) and _tests_wrapped(src, anc.test, name):
            orelse = anc.orelse if isinstance(anc.orelse, list) else [anc.orelse]
            if child in orelse:
                return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        child = anc
    return False


def _tests_wrapped(src: Source, test: ast.AST, name: str) -> bool:
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and len(test.args) == 2):
        return False
    if dotted(test.args[0]) != name:
        return False
    if test.func.id == "hasattr":
        return isinstance(test.args[1], ast.Constant) and test.args[1].value == "module"
    if test.func.id == "isinstance":
        classes = test.args[1].elts if isinstance(test.args[1], ast.Tuple) else [test.args[1]]
        return any(src.qualname(c) in N.DDP | N.DATA_PARALLEL for c in classes)
    return False
