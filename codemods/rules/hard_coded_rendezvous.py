"""DDP007 hard-coded-rendezvous."""

from __future__ import annotations

import ast
from typing import Iterator

from .._analysis import Source, spawns_its_own_processes
from ._base import Diagnostic, Rule

_KEYS = ("MASTER_ADDR", "MASTER_PORT")


class HardCodedRendezvous(Rule):
    """
    ## What it does
    Reports `MASTER_ADDR` / `MASTER_PORT` written into `os.environ` by the script
    (`os.environ["MASTER_PORT"] = "29500"`, `os.putenv(...)`). A default that the
    environment overrides (`os.environ.setdefault(...)`) is not reported: a
    launcher's or the user's value wins; nor is a program that starts its own
    processes (`mp.spawn`, `multiprocessing.Process`, a test's
    `MultiProcessTestCase`): no launcher sets the address there.

    ## Why is this bad?
    The rendezvous address belongs to the launcher: `torchrun --standalone` picks
    a free port, and `--rdzv_endpoint` names the host for several machines. A
    port fixed in code clashes when two jobs share a machine ("Address already
    in use") and a fixed address cannot work on several nodes.

    ## Example
    ```python
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    ```

    ## Use instead
    Nothing in the code; launch with `torchrun --standalone ...` on one machine or
    `torchrun --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT ...` on several.

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP007"
    NAME = "hard-coded-rendezvous"
    SEVERITY = "info"
    MESSAGE = "rendezvous address set in code: leave MASTER_ADDR/MASTER_PORT to torchrun (--standalone or --rdzv_endpoint)"
    TRIGGERS = _KEYS

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if spawns_its_own_processes(src):
            return  # no launcher: it must say where its processes meet
        for node in src.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and src.qualname(target.value) == "os.environ"
                        and isinstance(target.slice, ast.Constant)
                        and target.slice.value in _KEYS
                    ):
                        yield self.diagnostic(src, node)
            elif isinstance(node, ast.Call) and src.qualname(node.func) == "os.putenv":
                if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in _KEYS:
                    yield self.diagnostic(src, node)
