"""DDP002 ddp-without-process-group."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from .. import _names as N
from .._analysis import Source, is_collective
from .._program import imported_package_roots, project_setup_calls
from ._base import Diagnostic, Rule

_SETUP_HELPER = re.compile(r"(?i)(init|setup|set_up|launch).*(dist|ddp|process_group|parallel)|(dist|ddp).*(init|setup)")


class DDPWithoutProcessGroup(Rule):
    """
    ## What it does
    In a script that runs as an entry point (it has an `if __name__ == "__main__":`
    block or trains at module level), reports DistributedDataParallel or a
    collective (`barrier`, `all_reduce`, ...) when the file never calls
    `torch.distributed.init_process_group` and calls no set-up helper whose name
    says so (`init_distributed()`, `setup_ddp()`, ...), and the function that
    holds it is not handed to an imported launcher (`detectron2.engine.launch(main,
    ...)`, a framework's `run(main_worker, ...)`; not a standard-library one such
    as `threading.Thread(target=main)`). Library modules are not checked: their
    caller sets the process group up.

    ## Why is this bad?
    Every DDP process must join the process group before the first collective;
    DDP's constructor is one (it broadcasts rank 0's weights). Without it the
    script fails with "Default process group has not been initialized".

    ## Example
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank])
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    model = DistributedDataParallel(model, device_ids=[local_rank])
    ```

    ## Fix safety
    No automatic fix: where the set-up belongs depends on the program.
    """

    CODE = "DDP002"
    NAME = "ddp-without-process-group"
    SEVERITY = "error"
    MESSAGE = "DistributedDataParallel/collective used but the process group is never initialised: call dist.init_process_group() first"
    TRIGGERS = ("istributed",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not _is_entry(src):
            return
        first = None
        inits = []
        for call in src.calls:
            name = src.qualname(call.func)
            if name in N.SPAWN:
                return
            if name in N.INIT_PROCESS_GROUP:
                inits.append(call)
                continue
            if _SETUP_HELPER.search(name.rsplit(".", 1)[-1]):
                return
            if first is None and (name in N.DDP or is_collective(src, call)):
                first = call
        if first is not None and not any(_reached(src, init, first) for init in inits):
            inits = project_setup_calls(src)  # ``dist.init()`` of the project's own wrapper module (EDM)
        if first is not None and not any(_reached(src, init, first) for init in inits):
            if not _handed_to_a_launcher(src, first):
                yield self.diagnostic(src, first)


def _handed_to_a_launcher(src: Source, user: ast.AST) -> bool:
    """The function that holds ``user`` is handed to an imported callable
    (``detectron2.engine.launch(main, num_gpus, ...)``, a framework's
    ``run(main_worker, ...)``, ``mp.spawn`` by another name): that launcher
    starts the processes and sets up their process group."""
    func = src.function_of(user)
    while func is not None and src.function_of(func) is not None:
        func = src.function_of(func)
    if func is None or not hasattr(func, "name"):
        return False
    for call in src.calls:
        handed = any(isinstance(a, ast.Name) and a.id == func.name for a in call.args) or any(
            isinstance(k.value, ast.Name) and k.value.id == func.name for k in call.keywords
        )
        if handed and "." in src.qualname(call.func) and src.qualname(call.func).split(".")[0] in imported_package_roots(src):
            return True
    return False


def _reached(src: Source, call: ast.Call, user: Optional[ast.AST] = None) -> bool:
    """The set-up ``call`` may run: it is not in a module-level function that
    this file never names -- a helper left uncalled -- while ``user`` (the DDP
    wrap) is elsewhere.  One handed to ``mp.spawn`` counts, so does any method
    (Python or a framework calls ``__init__``), and so does a ``main()`` holding
    the wrap too (a console-script entry point calls it).  Without a ``user``,
    only a never-called helper that dp2ddp added does not count."""
    func = src.function_of(call)
    while func is not None and src.function_of(func) is not None:
        func = src.function_of(func)  # the outermost function
    if func is None or not hasattr(func, "name") or not isinstance(src.parent(func), ast.Module):
        return True  # module level, or a method (``__init__``, ``__enter__``: called by Python)
    name = func.name
    if any(
        isinstance(node, ast.Name) and node.id == name or isinstance(node, ast.Attribute) and node.attr == name
        for node in src.nodes
    ):
        return True
    if user is None:
        return "(added by dp2ddp)" not in (ast.get_docstring(func) or "")
    return any(a is func for a in src.ancestors(user))


def _is_entry(src: Source) -> bool:
    from .._facts import is_main_guard

    if any(is_main_guard(stmt) for stmt in src.tree.body):
        return True
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "backward"
        and src.function_of(node) is None
        for node in src.calls
    )
