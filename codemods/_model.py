"""The plain data of a conversion, without LibCST: a run's settings, a file's
role in the program, and the findings the transforms report.

Kept apart from ``_base`` (the transforms' LibCST machinery) so that the engine
can answer from its cache -- and the report, the review and the migration
summary can read results -- without importing LibCST (0.3 s of start-up).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Dict, Tuple

#: the comment that marks a spot left for a human in the converted code
MARKER = "# dp2ddp:"

#: the comment that marks a one-line form spelled out for the transforms
#: (``_oneliners``): in the code they see, never in an output
SPELLED_MARK = "# dp2ddp-spelled:"
SPELLED_MARKS = re.compile(r"[ \t]*# dp2ddp-spelled:[0-9a-f]+:\d+")


@dataclass(frozen=True)
class Settings:
    """Options of one conversion run (immutable; one object shared by all files)."""

    #: "global": DP's ``batch_size`` is the global batch, each process gets
    #: ``batch_size // world_size`` (the training math is kept).  "per-process":
    #: keep the number per process (global batch and learning rate change).
    batch_size: str = "global"
    #: Convert BatchNorm to SyncBatchNorm before wrapping (GPU only: the helper
    #: ``sync_batchnorm`` keeps BatchNorm on CPU, where SyncBatchNorm has no kernel).
    sync_bn: bool = False
    #: Put ``# dp2ddp:`` marker comments at spots left for a human.
    markers: bool = True


@dataclass(frozen=True)
class ModelAttributeFunction:
    """A function that reads its parameters' own attributes (see
    ``FileFacts.model_attribute_functions``)."""

    #: its positional parameters, in order
    params: Tuple[str, ...]
    #: parameter -> an attribute of it read that DDP does not forward (one other than
    #: state_dict where it reads one: the wrapper has state_dict, with other keys)
    attributes: Tuple[Tuple[str, str], ...]
    #: it steps an optimizer or calls backward() itself
    trains: bool


@dataclass(frozen=True)
class FileRole:
    """What a file is in the program being converted (decided by the engine)."""

    #: The process group is set up here (``__main__`` block or module-level script).
    is_entry: bool = False
    #: "main-block": set up in ``if __name__ == "__main__":``; "module": a script
    #: whose training runs at module level.
    entry_kind: str = ""
    #: Code in this file runs in the distributed program (after the process group is
    #: up), so per-rank guards (``dist.get_rank() == 0``) are safe in its functions.
    in_program: bool = True
    #: The program has no DataParallel: a single-device script whose model must be
    #: wrapped in DDP by us.
    single_device: bool = False
    #: The program builds no torch.optim optimizer (it updates parameters by hand):
    #: wrap-model has no module to wrap.
    no_optimizer: bool = False
    #: A module of the program builds BatchNorm layers (the model may live in another file).
    program_batchnorm: bool = False
    #: A module of the program builds DataLoaders (sharded once converted).
    program_loads_data: bool = False
    #: A module of the program saves or loads a state_dict.
    program_state_dict: bool = False
    #: the batch-size settings (last names: "batch_size") that a loss of the program
    #: builds its in-batch labels from and that a DataLoader of the program is given:
    #: the training loaders keep that many samples per process, which the labels assume
    program_batches_per_process: Tuple[str, ...] = ()
    #: methods of the program's classes that build and return an optimizer over their
    #: own module (``FileFacts.optimizer_methods``): ``model.configure_optimizers(cfg)``
    #: trains ``model``
    program_optimizer_methods: Tuple[str, ...] = ()
    #: a ``forward`` of the program tests a parameter for None (``FileFacts.forward_tests_none``):
    #: a training step that passes None there on some steps leaves its layers unused then
    program_forward_tests_none: bool = False
    #: The file already sets up DDP itself (init_process_group, DDP, spawn).
    already_distributed: bool = False
    #: ... through dp2ddp's own setup helper: converted earlier, and a DataParallel
    #: left then (reported) may be finished now
    set_up_by_dp2ddp: bool = False
    #: the entry file's process group is up wherever its code runs (dp2ddp set it
    #: up first thing): a bare ``dist.get_rank() == 0`` is safe there.  Not so for
    #: ``lint --fix`` on a script that starts it by hand, maybe late or only when
    #: launched distributed.
    group_always_up: bool = True
    #: the functions of the modules this file imports that read their parameters'
    #: own attributes (``FileFacts.model_attribute_functions``), by name -- a name
    #: two of them define differently is left out
    imported_model_functions: Tuple[Tuple[str, ModelAttributeFunction], ...] = ()
    #: the functions and classes of the modules this file imports that save the
    #: state_dict() of a model handed to them (``FileFacts.state_dict_savers``), by name
    imported_state_dict_savers: Tuple[Tuple[str, Tuple[Tuple[str, ...], Tuple[str, ...]]], ...] = ()
    #: the functions of the modules this file imports that only write files
    #: (``FileFacts.writing_functions``), by name
    imported_writing_functions: Tuple[str, ...] = ()


@dataclass
class Finding:
    code: str
    #: "change": rewritten; "manual": left for a human; "note": a consequence to know.
    kind: str
    line: int
    column: int
    message: str
    transform: str = ""
    path: str = ""

    def to_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


_LOCAL_DATA_PARALLEL = "DataParallel here is not torch's"


def local_data_parallel_note(resolves_to: str) -> str:
    """The note for a call of a project's own ``DataParallel`` (DDP001's transform
    and, for files that never import torch, the engine)."""
    return f"{_LOCAL_DATA_PARALLEL} (it resolves to {resolves_to or 'a local name'}); left alone"


def is_local_data_parallel_note(finding: Finding) -> bool:
    return finding.kind == "note" and finding.message.startswith(_LOCAL_DATA_PARALLEL)
