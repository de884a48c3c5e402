"""DDP303 ddp-wrapper-state-dict."""

from __future__ import annotations

import ast
from typing import Iterator, Set

from .. import _names as N
from .._analysis import Source, dotted, ddp_wrapped_names
from ._base import Diagnostic, Rule


class DDPWrapperStateDict(Rule):
    """
    ## What it does
    Reports a checkpoint saved (`torch.save`, directly or through a dict) from the
    `state_dict()` of a DistributedDataParallel wrapper, unless this file also
    loads it back into a DDP wrapper (a consistent round trip).

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
        if any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "load_state_dict" and dotted(c.func.value) in wrapped
            for c in src.calls
        ):
            return  # saved and loaded through the wrapper: consistent
        saved = _saved_names(src)
        for call in src.calls:
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "state_dict"):
                continue
            if dotted(call.func.value) not in wrapped:
                continue
            if _feeds_save(src, call, saved):
                yield self.diagnostic(src, call)


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
