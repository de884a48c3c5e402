"""DDP006 deprecated-launcher."""

from __future__ import annotations

import ast
from typing import Iterator

from .._analysis import Source, last_name
from ._base import Diagnostic, Rule


class DeprecatedLauncher(Rule):
    """
    ## What it does
    Reports a `--local_rank` / `--local-rank` command-line argument (unless its
    default reads `LOCAL_RANK` from the environment, as `dp2ddp convert` makes it,
    or the file reads `LOCAL_RANK` from the environment elsewhere: then the
    argument is only kept so that old launch commands still parse) and the
    `torch.distributed.launch` launcher named in code (e.g. in a command built
    by a script).

    ## Why is this bad?
    `python -m torch.distributed.launch` is the deprecated predecessor of
    `torchrun` (not an alias of it); it passed `--local_rank` on the command
    line. `torchrun` (and `python -m torch.distributed.run`, its alias) set the
    `LOCAL_RANK` environment variable instead, so the argument stays at its
    default and every process uses the same GPU.

    ## Example
    ```python
    parser.add_argument("--local_rank", type=int, default=0)
    torch.cuda.set_device(args.local_rank)
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    ```
    and launch with `torchrun --nproc_per_node=N script.py`.

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP006"
    NAME = "deprecated-launcher"
    SEVERITY = "warning"
    MESSAGE = "--local_rank comes from the deprecated torch.distributed.launch: read LOCAL_RANK from the environment (torchrun sets it)"
    TRIGGERS = ("local_rank", "local-rank", "distributed.launch")

    def check(self, src: Source) -> Iterator[Diagnostic]:
        reads_local_rank = _reads_local_rank_from_environment(src)
        for call in src.calls:
            if reads_local_rank:
                break  # ``--local_rank`` kept for torch.distributed.launch; the device comes from LOCAL_RANK
            if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                for arg in call.args:
                    if isinstance(arg, ast.Constant) and arg.value in ("--local_rank", "--local-rank"):
                        default = next((k.value for k in call.keywords if k.arg == "default"), None)
                        if default is None or "LOCAL_RANK" not in src.segment(default):
                            yield self.diagnostic(src, call)
                        break
        for node in src.nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "torch.distributed.launch" in node.value:
                # a command (``["python", "-m", "torch.distributed.launch", ...]``,
                # ``"python -m torch.distributed.launch ..."``), not prose (a docstring, a help text)
                command = node.value.strip() == "torch.distributed.launch" or "-m torch.distributed.launch" in node.value
                if command and not isinstance(src.parent(node), ast.Expr):
                    yield self.diagnostic(
                        src, node, "torch.distributed.launch is deprecated: launch with torchrun"
                    )
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                if "torch.distributed.launch" in names or module == "torch.distributed.launch":
                    yield self.diagnostic(src, node, "torch.distributed.launch is deprecated: use torch.distributed.run (torchrun)")


def _reads_local_rank_from_environment(src: Source) -> bool:
    """``int(os.environ["LOCAL_RANK"])``, ``os.environ.get("LOCAL_RANK", 0)``,
    ``os.getenv("LOCAL_RANK")`` anywhere in the file: what torchrun sets is read,
    and a ``--local_rank`` argument beside it is kept only for old launchers."""
    if "LOCAL_RANK" not in src.text:
        return False
    for node in src.of_type(ast.Constant):
        if node.value != "LOCAL_RANK":
            continue
        parent = src.parent(node)
        if isinstance(parent, ast.Subscript) and "environ" in src.segment(parent.value):
            return True
        if isinstance(parent, ast.Call) and last_name(parent.func) in ("get", "getenv"):
            if last_name(parent.func) == "getenv" or "environ" in src.segment(parent.func):
                return True
    return False
