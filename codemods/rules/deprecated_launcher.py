"""DDP006 deprecated-launcher."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from .._analysis import Source
from .._program import imported_facts
from ._base import Diagnostic, Rule


class DeprecatedLauncher(Rule):
    """
    ## What it does
    Reports a `--local_rank` / `--local-rank` command-line argument (unless its
    default reads `LOCAL_RANK` from the environment, as `dp2ddp convert` makes it,
    or the file or a module it imports reads `LOCAL_RANK` from the environment --
    `init_distributed_mode(args)` of many research repositories: then the
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
        reads_local_rank = imported_facts(src).reads_local_rank  # (here or in a module it imports)
        for call in src.calls:
            if reads_local_rank:
                break  # ``--local_rank`` kept for torch.distributed.launch; the device comes from LOCAL_RANK
            if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                for arg in call.args:
                    if isinstance(arg, ast.Constant) and arg.value in ("--local_rank", "--local-rank"):
                        default = next((k.value for k in call.keywords if k.arg == "default"), None)
                        if (default is None or "LOCAL_RANK" not in src.segment(default)) and _read(src):
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


_READ = re.compile(r"\.local_rank\b|\[['\"]local_rank['\"]\]|getattr\([^)]*['\"]local_rank['\"]")


def _read(src: Source) -> bool:
    """The parsed ``--local_rank`` is read somewhere -- ``args.local_rank``,
    ``vars(args)["local_rank"]``, here or in a module the file imports (the set-up
    helper it hands ``args`` to): an argument that nothing reads (SwAV's, "not used")
    picks no device."""
    if _READ.search(src.text):
        return True
    from .._program import imported_module_texts

    return any(_READ.search(text) for text in imported_module_texts(src).values())
