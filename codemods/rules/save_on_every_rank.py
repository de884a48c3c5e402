"""DDP302 save-on-every-rank."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from .. import _names as N
from .. import _writes as W
from .._analysis import (
    Source,
    called_unguarded,
    dotted,
    dumped_into_open,
    file_handler_added,
    file_handler_statements,
    opened_file_statements,
    is_main_process_check,
    is_image_save,
    is_pure,
    on_main_process_only,
    per_rank_target,
    write_target,
    long_lived_writer,
    open_for_writing,
    pure_writes,
    uses_distributed,
)
from ._base import Diagnostic, Rule


#: a save guarded by the local rank only (DDP302, as a warning)
LOCAL_RANK_MESSAGE = (
    "saved where LOCAL_RANK is 0: that is one process per machine, so on several machines each "
    "node's first process writes this same file (a race on a shared file system); guard it with the "
    "global rank (dist.get_rank() == 0), or give each node its own path"
)


class SaveOnEveryRank(Rule):
    """
    ## What it does
    In DDP code, reports `torch.save` -- and the other whole files a training
    script writes, `torchvision.utils.save_image`, `matplotlib.pyplot.savefig`/`imsave`
    and safetensors' `save_file`/`save_model`, a Pillow image's `.save(path)`
    (`Image.fromarray(a).save(p)`, `im.save(p)`), a log file's handler
    (`logger.addHandler(logging.FileHandler(path))`), a `with open(path, "w") as f:`
    whose body only writes the file (`json.dump(history, f)`, `f.write(...)`,
    a csv writer's rows), pandas' `df.to_csv(path)` / `to_json` / `to_parquet` /
    `to_pickle`, a method of a class of the file that writes a file (a
    project's own logger: `open("log.txt", "a").write(...)` in `add()`) --
    that every rank reaches: not under a
    main-process check (`if dist.get_rank() == 0:`, `if is_main_process():`,
    after `if rank != 0: return`), and not in a
    function that this file only calls under such a check. A `torch.save` under
    a check of the local rank only (`if local_rank == 0:`, `if args.local_rank in
    [-1, 0]:`) is a warning: one writer per machine, which on several machines
    sharing a file system is several writers of one file. A function this file
    never calls (an API: `save_checkpoint()` in a utilities module) is not
    reported: its callers elsewhere decide. Neither is a save into an in-memory
    buffer (`io.BytesIO`) or to a path that names the rank or comes from
    `tempfile` (one file per rank).

    Also the folders and paths around those files: `if not os.path.isdir(d):
    os.makedirs(d)` (or `os.mkdir`, `os.path.exists`, a bare `os.makedirs(d)`
    without `exist_ok=True`) on every rank -- every rank passes the check, all
    but the first to create the folder get `FileExistsError` -- and
    `shutil.rmtree(p)` / `os.remove(p)` of a shared path on every rank (`if
    os.path.isdir(p): shutil.rmtree(p)` at start-up): the others find it gone,
    or lose what a rank wrote there.

    ## Why is this bad?
    All ranks hold the same weights and write the same path at the same time:
    wasted I/O at best, a corrupt or truncated checkpoint at worst (several
    writers on a shared file system).

    ## Example
    ```python
    torch.save(model.module.state_dict(), "checkpoint.pt")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.barrier()  # if other ranks read the file afterwards
    ```

    ```python
    os.makedirs(folder, exist_ok=True)  # safe on every rank
    if dist.get_rank() == 0:
        shutil.rmtree("old_runs", ignore_errors=True)
    dist.barrier()  # where every rank reaches it
    ```

    ## Fix safety
    Safe: the file is written once, with the same content; a barrier is added
    where the script reads the file back and every rank reaches that spot.
    A folder creation becomes `os.makedirs(path, exist_ok=True)`; a removal goes
    on the main process with a `dist.barrier()` after it where every rank
    reaches it (not fixed in a loop over a folder's listing).
    """

    CODE = "DDP302"
    NAME = "save-on-every-rank"
    SEVERITY = "error"
    MESSAGE = "torch.save runs on every rank: save from the main process only (if dist.get_rank() == 0)"
    FIX = "safe"
    FIX_TRANSFORMS = ("save-on-main",)
    FIX_DESCRIPTION = "put torch.save behind `if dist.get_rank() == 0:`"
    TRIGGERS = (
        ("save", "istributed"), ("open", "istributed"), ("mkdir", "istributed"), ("makedirs", "istributed"),
        ("rmtree", "istributed"), ("remove", "istributed"), ("unlink", "istributed"), ("rmdir", "istributed"),
        ("to_", "istributed"), ("FileHandler", "istributed"),
    )

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        yield from self._folders_and_removals(src)
        for call in W.file_logger_calls(src):  # a project's own logger: writer.add_scalar(...)
            if W.every_rank(src, call):
                logger = W.logger_of(src, call)
                what = dict(cls=logger.cls.name, method=call.func.attr)
                message = W.FILE_LOGGER_MESSAGE.format(**what)
                if logger.truncates:
                    message += W.FILE_LOGGER_TRUNCATES.format(**what)
                found = self.diagnostic(src, call, message)
                if logger.truncates or not all(is_pure(a) for a in (*call.args, *(k.value for k in call.keywords))):
                    found.fix = None
                yield found
        for call in W.frame_writes(src):  # pandas: df.to_csv(path)
            if _in_writing_with(src, call) or not W.every_rank(src, call):
                continue
            found = self.diagnostic(
                src, call, f"{dotted(call.func) or call.func.attr} runs on every rank: the same file is written by "
                "each; write it from the main process only (if dist.get_rank() == 0)"
            )
            if not W.frame_write_is_pure(src, call):
                found.fix = None  # what it writes is computed there: convert leaves it
            yield found
        for stmt in src.of_type(ast.With):
            call = _open_for_writing(src, stmt)
            if call is None:
                kept_open = long_lived_writer(src, stmt)
                if kept_open is not None and not on_main_process_only(src, stmt) and not per_rank_target(src, kept_open.args[0]):
                    func = src.function_of(stmt)
                    if func is None or called_unguarded(src, func):
                        found = self.diagnostic(src, kept_open, LONG_LIVED_MESSAGE)
                        found.fix = None
                        yield found
                continue
            if on_main_process_only(src, stmt) or per_rank_target(src, call.args[0]):
                continue
            func = src.function_of(stmt)
            if func is not None and not called_unguarded(src, func):
                continue
            found = self.diagnostic(
                src, call, "every rank writes this file (the same path on each): write it from the "
                "main process only (if dist.get_rank() == 0)"
            )
            if not pure_writes(stmt):
                found.fix = None  # what it writes is computed there: convert leaves it
            yield found
        for opened in {a for a in opened_file_statements(src).values()}:
            func = src.function_of(opened)
            if on_main_process_only(src, opened) or func is not None and not called_unguarded(src, func):
                continue
            yield self.diagnostic(
                src, opened.value, "every rank opens and writes this file (the same path on each): open, "
                "write and close it on the main process only (if dist.get_rank() == 0)"
            )
        for handler in {a for a in file_handler_statements(src).values()}:
            func = src.function_of(handler)
            if on_main_process_only(src, handler) or func is not None and not called_unguarded(src, func):
                continue
            yield self.diagnostic(
                src, handler.value, "a logging.FileHandler made on every rank: each appends to the same log "
                "file; make and add it on the main process only (if dist.get_rank() == 0)"
            )
        for call in src.calls:
            name = src.qualname(call.func)
            opened = dumped_into_open(src, call)  # json.dump(history, open(path, "w"))
            if name not in N.TORCH_SAVE and name not in N.ARTIFACT_WRITES and opened is None and not is_image_save(
                src, call
            ) and not file_handler_added(src, call):
                continue
            if on_main_process_only(src, call) and name in N.TORCH_SAVE and _guarded_by_local_rank(src, call):
                found = self.diagnostic(src, call, LOCAL_RANK_MESSAGE)
                found.severity, found.fix = "warning", None  # (right on one machine)
                yield found
                continue
            if on_main_process_only(src, call) or _in_writing_with(src, call):
                continue  # (one in a ``with open(...)`` is reported there)
            target = write_target(src, call)
            if target is not None and per_rank_target(src, target):
                continue  # a BytesIO buffer, or one file per rank
            func = src.function_of(call)
            if func is not None and not called_unguarded(src, func):
                continue
            if func is not None and W.built_main_process_first(src, call):
                continue  # rank 0 writes first; the others find the file (``torch_distributed_zero_first``)
            if name in N.TORCH_SAVE:
                yield self.diagnostic(src, call)
            elif opened is not None:
                found = self.diagnostic(
                    src, call, f"{dotted(call.func)}(..., open(...)) runs on every rank: the same "
                    "file is written by each; write it from the main process only (if dist.get_rank() == 0)"
                )
                if not all(is_pure(a) for a in call.args if a is not opened):
                    found.fix = None  # what it writes is computed there: convert leaves it
                yield found
            else:
                found = self.diagnostic(
                    src, call, f"{_writer_label(src, call, name)} runs on every rank: the same file is written by "
                    "each; write it from the main process only (if dist.get_rank() == 0)"
                )
                if not all(is_pure(a) for a in call.args):
                    found.fix = None  # what it writes is computed there (maybe a collective): convert leaves it
                yield found


    def _folders_and_removals(self, src: Source) -> Iterator[Diagnostic]:
        """``_writes``' decision (convert's save-on-main edits where it points)."""
        for creation in W.folder_creations(src):
            if W.every_rank(src, creation.call):
                found = self.diagnostic(src, creation.call, W.FOLDER_MESSAGE)
                if found.fix is not None:
                    found.fix = {**found.fix, "description": "use `os.makedirs(path, exist_ok=True)`"}
                yield found
        for removal in W.removals(src):
            if W.every_rank(src, removal.call):
                found = self.diagnostic(src, removal.call, W.REMOVAL_MESSAGE)
                if removal.unfixable is not None:
                    found.fix = None
                elif found.fix is not None:
                    found.fix = {**found.fix, "description": "remove it behind `if dist.get_rank() == 0:`, then `dist.barrier()`"}
                yield found


#: (convert reports the same spot with it)
LONG_LIVED_MESSAGE = (
    "every rank opens this file for writing (the same path on each) and keeps it open around "
    "other work: open it on the main process only -- and write to it there -- or give each rank its own file"
)


def _open_for_writing(src: Source, stmt: ast.With) -> Optional[ast.Call]:
    """The ``open(P, "w")`` of a one-item ``with`` that only writes that file."""
    calls = open_for_writing(src, stmt)
    return calls[0] if len(stmt.items) == 1 and calls else None


def _in_writing_with(src: Source, call: ast.Call) -> bool:
    parent = src.parent(src.parent(call))
    return isinstance(parent, ast.With) and _open_for_writing(src, parent) is not None




def _writer_label(src: Source, call: ast.Call, name: str) -> str:
    """How the message names the write: ``np.save``, ``grid.save``, the image's save()."""
    label = dotted(call.func)
    if label:
        return label
    if is_image_save(src, call):
        return "the image's save()"
    if file_handler_added(src, call):
        return "a logging.FileHandler added"
    return name.rsplit(".", 1)[-1]


def _guarded_by_local_rank(src: Source, call: ast.Call) -> bool:
    """The main-process check that guards ``call`` asks for the local rank only
    (``if local_rank == 0:``, ``if args.local_rank in [-1, 0]:``,
    ``int(os.environ["LOCAL_RANK"]) == 0``), never for the global one."""
    child: ast.AST = call
    for anc in src.ancestors(call):
        if isinstance(anc, ast.If) and child in anc.body and is_main_process_check(src, anc.test):
            words = [
                n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else n.value
                for n in ast.walk(anc.test)
                if isinstance(n, (ast.Name, ast.Attribute)) or isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            local = any("local" in w.lower() for w in words)
            other = any(("rank" in w.lower() or w in ("get_rank", "is_main_process")) and "local" not in w.lower() for w in words)
            return local and not other
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = anc
    return False
