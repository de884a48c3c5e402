"""DDP001 data-parallel."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, bare_data_parallel_references, dotted
from ._base import Diagnostic, Rule


class DataParallelInUse(Rule):
    """
    ## What it does
    Finds `torch.nn.DataParallel` in every spelling (`nn.DataParallel`,
    `nn.parallel.DataParallel`, `from torch.nn.parallel import DataParallel as DP`),
    resolved through the file's imports; a project's own class named
    `DataParallel` is not torch's and is not reported. Subclasses of it and the
    functional `torch.nn.parallel.data_parallel` are reported too.

    ## Why is this bad?
    DataParallel is one process driving every GPU from threads: the model is
    replicated and the outputs gathered on GPU 0 at every step, and the Python
    GIL serialises the work, so it scales poorly and GPU 0 runs out of memory
    first. PyTorch recommends DistributedDataParallel even on a single machine.

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    ```python
    model = DistributedDataParallel(model.to(device), device_ids=[local_rank])
    ```
    launched with `torchrun --nproc_per_node=N`. `dp2ddp convert` does the whole
    migration (process group, sampler, checkpoints, logging).

    ## Fix safety
    Safe: the fix is the `dp2ddp convert` migration, which keeps the training
    math (the global batch is split across the processes) and keeps the script
    runnable with plain `python` as a world of one. Spots it cannot convert are
    left as they are and reported.
    """

    CODE = "DDP001"
    NAME = "data-parallel"
    SEVERITY = "error"
    MESSAGE = "DataParallel in use: migrate to DistributedDataParallel (`dp2ddp convert`)"
    FIX = "safe"
    FIX_TRANSFORMS = ("*",)
    FIX_DESCRIPTION = "convert the program to DistributedDataParallel"
    IN_TESTS = False  # a test exercises it on purpose
    TRIGGERS = ("DataParallel", "data_parallel")

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for node in src.calls_to(N.ANY_DATA_PARALLEL):
            if src.qualname(node.func) in N.DATA_PARALLEL:
                head = dotted(node.func).split(".")[0]
                if head not in src.aliases and "import *" in src.text:
                    # torch reaches the file through a star import: convert cannot
                    # resolve it, so no fix is offered (it would change nothing)
                    found = self.diagnostic(
                        src, node, f"{self.MESSAGE}; `{head}` comes through `import *`: import it "
                        "explicitly so that `dp2ddp convert` can resolve it"
                    )
                    found.fix = None
                    yield found
                    continue
                found = self.diagnostic(src, node)
                if _sets_up_ddp_by_hand(src):
                    found.fix = None  # the non-distributed branch of a DDP script: convert leaves it
                yield found
            else:
                yield self.diagnostic(
                    src, node, "functional data_parallel() in use: call a DDP-wrapped module instead"
                )
        for node in bare_data_parallel_references(src):
            found = self.diagnostic(
                src, node, "DataParallel referenced, not called here (an alias, a factory argument): "
                "the wrap made through it is not converted; use DistributedDataParallel",
            )
            found.fix = None
            yield found
        for node in src.of_type(ast.ClassDef):
            for base in node.bases:
                if src.qualname(base) in N.DATA_PARALLEL:
                    yield self.diagnostic(
                        src, node, f"class {node.name} subclasses DataParallel: port it to DDP"
                    )


def _sets_up_ddp_by_hand(src: Source) -> bool:
    """The file sets DDP up itself (not through dp2ddp's helper): its DataParallel
    is the fallback branch (pytorch/examples' ImageNet), which convert leaves."""
    if "init_process_group" not in src.text and "spawn" not in src.text and "start_processes" not in src.text:
        return False  # (the cheap test first: most DataParallel scripts)
    cached = src.cache.get("sets_up_ddp_by_hand")
    if cached is None:
        from .._facts import collect_facts

        facts = collect_facts(src)
        # (its own init_process_group/spawn: a module with a DDP wrap and no set-up of
        # its own may belong to a program dp2ddp set up, whose DataParallel convert finishes)
        cached = src.cache["sets_up_ddp_by_hand"] = facts.setup == "hand"
    return bool(cached)
