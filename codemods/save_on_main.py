"""DDP302 save-on-main: write checkpoints from the main process only.

Every DDP process holds the same weights; if all of them ``torch.save`` to the
same path they race and can leave a corrupt file (D2).  The save, and the file
operations right after it that handle the same checkpoint (``shutil.copyfile``
to ``model_best``, ``os.replace``...), go behind one main-process check::

    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, "model_best.pth")

becomes::

    if dist.get_rank() == 0:
        torch.save(state, path)
        if is_best:
            shutil.copyfile(path, "model_best.pth")

Likewise ``with open(path, "w") as f:`` whose body only writes the file
(``json.dump(history, f)``, ``f.write(...)``, a ``csv.writer``'s rows, ``pickle.dump``)
to a path that does not name the rank: a history, a config, a results table.

When the script reads that path back later (``torch.load`` of the same path
expression) a ``dist.barrier()`` follows, so that no rank reads a file that rank 0
is still writing -- but only where every rank reaches that spot (not inside a
condition); elsewhere the spot is reported.

The folders and paths around the files (``_writes``, lint's DDP302 decision):
``if not os.path.isdir(d): os.makedirs(d)`` -- every rank checks, every rank
creates, the loser gets ``FileExistsError`` -- becomes ``os.makedirs(d,
exist_ok=True)`` on every rank (so does a bare ``os.mkdir(d)``/``os.makedirs(d)``);
``shutil.rmtree(p)``/``os.remove(p)`` of a shared path (``if os.path.isdir(p):
shutil.rmtree(p)`` at start-up) goes on the main process, followed by
``dist.barrier()`` where every rank reaches it -- or is reported where no barrier
can go.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from . import _analysis as A
from . import _names as N
from . import _patterns as P
from . import _writes as W
from ._bridge import byte_offset
from ._guard import MainProcessGuard, single_call

_FILE_OPS = frozenset(
    {
        "shutil.copyfile",
        "shutil.copy",
        "shutil.copy2",
        "shutil.move",
        "os.replace",
        "os.rename",
        "os.remove",
        "os.unlink",
        "os.symlink",
    }
)


class SaveOnMainProcess(MainProcessGuard):
    CODE = "DDP302"
    NAME = "save-on-main"
    DESCRIPTION = "Guard torch.save (and the file operations after it) with a main-process check."
    # (savefig, save_image, np.save too; with open(p, "w"); json.dump(x, open(p, "w")); folders made and removed)
    TRIGGERS = ("save", "open", "mkdir", "makedirs", "rmtree", "remove", "unlink", "rmdir", "basicConfig")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._loaded_paths: Optional[Set[str]] = None
        self._creations: Optional[Dict[Tuple[int, int], W.FolderCreation]] = None
        self._removal_stmts: Optional[Dict[Tuple[int, int], W.Removal]] = None
        #: ``with`` statement -> the DDP models its file of samples is drawn through (``_sampled``)
        self._sampled_through: Dict[cst.With, Optional[Set[str]]] = {}
        #: writes left on every rank because their arguments compute (reported once)
        self._computed_writes: Set[cst.BaseStatement] = set()
        #: scope -> the names given to computed values there (split_write)
        self._split_names: Dict[cst.CSTNode, Set[str]] = {}
        self._file_handlers: Optional[Set[Tuple[int, int]]] = None  # (_handler_statements)
        self._opened_files: Optional[Set[Tuple[int, int]]] = None  # (_opened_file_statements)

    # -- folders made and paths removed (``_writes``) ----------------------------
    def _ast_key(self, node: cst.CSTNode) -> Tuple[int, int]:
        """(line, ``ast``'s byte column) of ``node``: where the recognisers put it."""
        line, column = self.position(node)
        return line, byte_offset(self.ast_source.lines, line, column)

    def _creation(self, node: cst.CSTNode) -> Optional[W.FolderCreation]:
        """The racing folder creation whose call (or check-then-create ``if``) is ``node``."""
        if self._creations is None:
            self._creations = {}
            for creation in W.folder_creations(self.ast_source):
                self._creations[(creation.call.lineno, creation.call.col_offset)] = creation
                if creation.check is not None:
                    self._creations[(creation.check.lineno, creation.check.col_offset)] = creation
        return self._creations.get(self._ast_key(node))

    def _removals(self) -> Dict[Tuple[int, int], W.Removal]:
        if self._removal_stmts is None:
            self._removal_stmts = {(r.stmt.lineno, r.stmt.col_offset): r for r in W.removals(self.ast_source)}
        return self._removal_stmts

    def _removal(self, stmt: cst.CSTNode) -> Optional[W.Removal]:
        """The removal of a shared path whose statement to guard is ``stmt``."""
        if not isinstance(stmt, (cst.SimpleStatementLine, cst.If)):
            return None
        return self._removals().get(self._ast_key(stmt))

    def _sampled(self, stmt: cst.With) -> Optional[Set[str]]:
        """The DDP models a ``with open(...)`` block draws its samples through
        (``_writes.sampled_through_the_model``), when it can go to the main process
        as a whole; None otherwise."""
        if stmt not in self._sampled_through:
            node = self._ast_with(stmt)
            self._sampled_through[stmt] = (
                None
                if node is None or P.under_main_process_check(self, stmt)
                or any(isinstance(i.item, cst.Call) and self._per_rank_path(i.item) for i in stmt.items)
                else W.sampled_through_the_model(self.ast_source, node)
            )
        return self._sampled_through[stmt]

    def _ast_with(self, stmt: cst.With) -> Optional[ast.With]:
        """The ``ast`` statement of ``stmt`` (the one the decisions are made on)."""
        line = self.position(stmt)[0]
        return next((w for w in self.ast_source.of_type(ast.With) if w.lineno == line), None)

    def _model_call_sampled_on_main(self, call: cst.Call) -> bool:
        """``model(input, state)`` inside a block that ``_sampled`` takes."""
        name = P.dotted_name(call.func)
        for anc in self.ancestors(call):
            if isinstance(anc, cst.With):
                models = self._sampled(anc)
                if models is not None:
                    return name in models
            if isinstance(anc, (cst.FunctionDef, cst.Module)):
                return False
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        """``os.makedirs(d)`` / ``os.mkdir(d)`` -> ``os.makedirs(d, exist_ok=True)``:
        safe on every rank (the first one creates it, the others find it)."""
        if isinstance(original_node.func, (cst.Name, cst.Attribute)) and self._model_call_sampled_on_main(original_node):
            return updated_node.with_changes(func=cst.Attribute(value=updated_node.func, attr=cst.Name("module")))
        if not self.is_call(original_node, W.MAKE_FOLDER) or P.under_main_process_check(self, original_node):
            return updated_node
        creation = self._creation(original_node)
        if creation is None or (creation.call.lineno, creation.call.col_offset) != self._ast_key(original_node):
            return updated_node
        if creation.check is None:
            self.changed(
                original_node,
                "os.makedirs(..., exist_ok=True): every rank creates the folder, and without exist_ok "
                "all but the first would fail with FileExistsError",
            )
        func = updated_node.func
        if isinstance(func, cst.Attribute):
            func = func.with_changes(attr=cst.Name("makedirs"))
        elif "os.mkdir" in self.qnames(original_node.func):
            func = cst.Attribute(value=cst.Name(self.module_alias("os", "os")), attr=cst.Name("makedirs"))
        args = [a for a in updated_node.args if not (a.keyword is not None and a.keyword.value == "exist_ok")]
        if args and len(args) < len(updated_node.args):
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        call = updated_node.with_changes(func=func, args=args)
        return P.append_arg(call, P.keyword_arg("exist_ok", cst.Name("True")))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        """``if not os.path.isdir(d): os.makedirs(d)`` -> ``os.makedirs(d, exist_ok=True)``
        (the call was rewritten on the way up); the ``if``'s comments stay above it."""
        creation = self._creation(original_node)
        if creation is None or creation.check is None or P.under_main_process_check(self, original_node):
            return updated_node
        if (creation.check.lineno, creation.check.col_offset) != self._ast_key(original_node):
            return updated_node
        body = updated_node.body
        lead = list(updated_node.leading_lines)
        if isinstance(body, cst.IndentedBlock):
            if body.header.comment is not None:
                lead.append(cst.EmptyLine(comment=body.header.comment))
            stmt = body.body[0]
            stmt = stmt.with_changes(leading_lines=[*lead, *stmt.leading_lines])
        else:
            stmt = cst.SimpleStatementLine(
                body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in body.body],
                leading_lines=lead,
                trailing_whitespace=body.trailing_whitespace,
            )
        self.changed(
            original_node,
            "check-then-create -> os.makedirs(..., exist_ok=True): every rank passed the check, "
            "and all but the first to create the folder failed with FileExistsError",
        )
        return stmt

    def starts(self, stmt: cst.BaseStatement) -> Optional[str]:
        removal = self._removal(stmt)
        if removal is not None and removal.unfixable is None and self.before_process_group(stmt) is None:
            return "the shared path is removed by the main process only (every rank would remove it)"
        if self._ast_key(stmt) in self._handler_statements():
            return "the log file's handler is made and added on the main process only (every rank would append to the same file)"
        if self._ast_key(stmt) in self._opened_file_statements():
            return "the file is opened, written and closed by the main process only (every rank would write the same file)"
        call = single_call(stmt)
        if call is not None and self.is_call(call, N.TORCH_SAVE) and not self._per_rank_path(call):
            owner = self.parent(self.parent(stmt))
            if isinstance(owner, cst.With) and (self._with_open_save(owner) or self._with_open_write(owner)):
                return None  # the whole `with open(...)` is guarded instead
            return "torch.save runs on the main process only (every rank holds the same weights)"
        if isinstance(stmt, cst.With) and self._with_open_save(stmt):
            return "the checkpoint file is written by the main process only"
        if isinstance(stmt, cst.With) and self._with_open_write(stmt):
            return "the file is written by the main process only (every rank would write the same file)"
        if isinstance(stmt, cst.With) and self._sampled(stmt):
            return (
                "the file of samples is drawn and written by the main process only, through the bare "
                "model (model.module: no DDP forward on one rank)"
            )
        if (
            call is not None
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "save_pretrained"
            and not self._per_rank_path(call)
        ):  # Hugging Face models, tokenizers, configs: a folder of files each rank would write
            return "save_pretrained runs on the main process only (every rank would write the same files)"
        if call is not None and self._file_handler_added(call):
            return "the log file is set up on the main process only (every rank would append to the same file)"
        if call is not None and self._image_save(call) and not self._per_rank_path(call):
            if not all(P.is_pure(a.value) for a in call.args):
                return None  # (what it writes is computed here)
            return "the image is written by the main process only (every rank would write the same file)"
        if call is not None and self.is_call(call, N.ARTIFACT_WRITES) and not self._per_rank_path(call):
            if not all(P.is_pure(a.value) for a in call.args):
                # (what it writes is computed here: maybe a collective every rank must run)
                self._report_computed_write(stmt, call)
                return None
            return f"{P.dotted_name(call.func)} runs on the main process only (every rank would write the same file)"
        if call is not None and self._logger_call(call) is not None:  # writer.add_scalar(...) of a class of the file
            node = self._logger_call(call)
            logger = W.logger_of(self.ast_source, node)
            if logger is None or logger.truncates or not all(P.is_pure(a.value) for a in call.args):
                return None  # (reported: visit_Call)
            return f"{logger.cls.name}.{node.func.attr}() writes a file: on the main process only (every rank would write its lines into it)"
        if call is not None and self._frame_write(call) is not None:  # pandas: df.to_csv(path)
            node = self._frame_write(call)
            if not W.frame_write_is_pure(self.ast_source, node):
                return None  # (what it writes is computed here)
            return f"{P.dotted_name(call.func) or call.func.attr.value} runs on the main process only (every rank would write the same file)"
        if call is not None and self.is_call(call, N.WRITE_DUMPS) and not self._per_rank_path(call):
            node = self.ast_call(call)  # json.dump(history, open(path, "w"))
            if node is not None and A.dumped_into_open(self.ast_source, node) and all(
                P.is_pure(a.value) or P.dotted_name(getattr(a.value, "func", None) or a.value) == "open" for a in call.args
            ):
                return f"{P.dotted_name(call.func)} into a file runs on the main process only (every rank would write the same file)"
        return None

    def _frame_write(self, call: cst.Call):
        """The ``ast`` call of ``df.to_csv(path)`` when ``_writes.frame_writes`` (lint's
        DDP302 decision) takes it, else None."""
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in W.FRAME_WRITE_METHODS):
            return None
        if getattr(self, "_frames", None) is None:
            self._frames = {(c.lineno, c.col_offset): c for c in W.frame_writes(self.ast_source)}
        return self._frames.get(self._ast_key(call))

    def _logger_call(self, call: cst.Call):
        """The ``ast`` call of ``writer.add_scalar(...)`` when ``_writes.file_logger_calls``
        (lint's DDP302 decision) takes it: a writing method of a class of this file."""
        if not isinstance(call.func, cst.Attribute):
            return None
        if getattr(self, "_logger_calls", None) is None:
            self._logger_calls = {(c.lineno, c.col_offset): c for c in W.file_logger_calls(self.ast_source)}
        return self._logger_calls.get(self._ast_key(call)) if self._logger_calls else None

    def _report_logger_call(self, call: cst.Call) -> None:
        """A writing method of a logger class of the file that cannot simply go
        behind the check (its file is kept open from mode "w", its arguments
        compute, it is not a statement of its own, where no guard can go): reported."""
        node = self._logger_call(call)
        if node is None or P.under_main_process_check(self, call):
            return
        stmt = self.statement_of(call)
        block = self.parent(stmt) if stmt is not None else None
        if (
            stmt is not None and single_call(stmt) is call and block is not None and self.guardable_block(block)
            and self.before_process_group(stmt) is None and self.starts(stmt) is not None
        ):
            return  # guarded
        logger = W.logger_of(self.ast_source, node)
        what = dict(cls=logger.cls.name, method=node.func.attr)
        self.manual(
            call, W.FILE_LOGGER_MESSAGE.format(**what) + (W.FILE_LOGGER_TRUNCATES.format(**what) if logger.truncates else "")
        )

    def _per_rank_path(self, call: cst.Call) -> bool:
        """A target every rank needs or has its own of (a path that names the rank,
        a tempfile path, an in-memory buffer): lint's decision, ``per_rank_target``."""
        node = self.ast_call(call)
        target = A.write_target(self.ast_source, node) if node is not None else None
        return target is not None and A.per_rank_target(self.ast_source, target)

    def continues(self, stmt: cst.BaseStatement) -> bool:
        if self.starts(stmt) is not None:
            return True
        call = single_call(stmt)
        if call is not None:
            return self.is_call(call, _FILE_OPS)
        if isinstance(stmt, cst.If) and stmt.orelse is None:
            body = stmt.body.body
            return (
                P.is_pure(stmt.test)
                and any(self.continues(s) for s in body)
                and all(self.continues(s) or self._local_assignment(s, stmt) for s in body)
            )
        return False

    def _local_assignment(self, stmt: cst.BaseStatement, block_owner: cst.If) -> bool:
        """``best_path = os.path.join(...)``: pure, and used only inside ``block_owner``."""
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
            return False
        assign = stmt.body[0]
        if not P.is_pure(assign.value):
            return False
        name = assign.targets[0].target
        scope = self.get_metadata(ScopeProvider, name, None)
        if scope is None:
            return False
        for access in scope.accesses[name.value]:
            if not any(anc is block_owner for anc in self.ancestors(access.node)):
                return False
        return True

    def _with_open_save(self, stmt: cst.With) -> bool:
        opens = all(
            m.matches(item.item, m.Call(func=m.Name("open"))) for item in stmt.items
        )
        body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []
        return opens and bool(body) and all(
            (c := single_call(s)) is not None and self.is_call(c, N.TORCH_SAVE) for s in body
        )

    def _with_open_write(self, stmt: cst.With) -> bool:
        """``with open(P, "w") as f:`` whose body only writes the file -- dumps,
        ``f.write(...)``, a csv writer and its rows, of values that compute nothing
        (``_analysis.open_for_writing``, lint's DDP302 test) -- to a path ``P`` that
        is not this process's own."""
        node = self._ast_with(stmt)
        if node is None or not A.open_for_writing(self.ast_source, node) or not A.pure_writes(node):
            return False
        return not any(isinstance(i.item, cst.Call) and self._per_rank_path(i.item) for i in stmt.items)

    def _note_whole_model(self, call: cst.Call) -> None:
        """``torch.save(self.model, path)`` of a model wrapped elsewhere (the Trainer
        gets the DDP model from train.py): the file pickles the wrapper, which does
        not load without a process group.  Noted; a wrap in this file is handled
        where it is converted (data-parallel-to-ddp, module-access)."""
        if not call.args or call.args[0].keyword is not None:
            return
        name = P.dotted_name(call.args[0].value)
        last = name.rsplit(".", 1)[-1].lower()
        if not name or not (last in ("model", "net", "network") or last.endswith(("_model", "_net"))):
            return
        if name in {n for _, n, _ in A._wrapped_models(self.ast_source, N.DATA_PARALLEL | N.DDP)}:
            return
        self.note(
            call,
            f"torch.save({name}, ...) pickles the whole object: if {name} is the DDP-wrapped model "
            "(wrapped in another module), the file cannot be loaded without a process group; "
            f"save {name}.module (or its state_dict())",
        )

    def visit_With(self, node: cst.With) -> None:
        """``with open("log.csv", "w") as f:`` around the training loop, writing rows
        in it: the block cannot go behind a main-process check as a whole, so it
        is reported (lint's DDP302 test, ``_analysis.long_lived_writer``)."""
        if not any(isinstance(i.item, cst.Call) and m.matches(i.item.func, m.Name("open")) for i in node.items):
            return
        stmt = self._ast_with(node)
        call = A.long_lived_writer(self.ast_source, stmt) if stmt is not None else None
        if call is None or P.under_main_process_check(self, node) or self._sampled(node):
            return  # (a file of samples: guarded as a whole, see starts)
        func = self.ast_source.function_of(stmt)
        elsewhere = False
        if func is not None and not A.called_unguarded(self.ast_source, func):
            if A.calls_of(self.ast_source, func) or self.role.is_entry or not self.role.in_program:
                return  # (called on the main process only here; or a helper nothing runs)
            elsewhere = True  # a module's helper (save_opts in options.py): its callers are in other files
        if any(isinstance(i.item, cst.Call) and self._per_rank_path(i.item) for i in node.items):
            return
        from .rules.save_on_every_rank import LONG_LIVED_MESSAGE

        self.manual(
            node,
            LONG_LIVED_MESSAGE
            + (" (unless the modules that call this function call it on the main process only)" if elsewhere else ""),
        )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call(node, W.REMOVE_PATH):
            self._report_removal(node)
        self._report_logger_call(node)
        if self.is_call(node, N.TORCH_SAVE):
            self._note_whole_model(node)
        # a torch.save that is not a statement of its own (in an expression, a lambda)
        if self.is_call(node, N.TORCH_SAVE):
            parent = self.parent(node)
            if not isinstance(parent, cst.Expr) and not P.under_main_process_check(self, node):
                self.manual(node, "torch.save inside an expression: make sure only rank 0 writes")

    def _report_removal(self, call: cst.Call) -> None:
        """A removal of a shared path that cannot go on the main process with a
        barrier after it (computed there, in a loop over a folder's listing, at
        import time, before the process group is up): reported."""
        if P.under_main_process_check(self, call) or self.parent(call) is None:
            return
        node = self.ast_call(call)
        removal = next((r for r in self._removals().values() if r.call is node), None) if node else None
        if removal is None:
            return
        stmt = self.statement_at(removal.stmt.lineno)
        why = removal.unfixable
        if why is None and stmt is not None:
            block = self.parent(stmt)
            if block is not None and not self.guardable_block(block):
                why = self.before_process_group(stmt) or "it runs where the process group may not be up"
            else:
                why = self.before_process_group(stmt)
        if why is not None:
            self.manual(call, f"{W.REMOVAL_MESSAGE} -- not done here: {why}")

    def refuse(self, run: Sequence[cst.BaseStatement]) -> Optional[str]:
        """The file is read back before the first spot every rank reaches (``if
        loss < best: torch.save(..., p); model.load_state_dict(torch.load(p))``):
        a barrier cannot go between them -- the condition may differ between
        ranks -- and without one the other ranks read a file not yet written."""
        paths = self._run_paths(run)
        anchor = self._anchor(run[0])
        if not paths or anchor is None or anchor is run[0]:
            return None
        inside = {id(n) for stmt in run for n in P.walk(stmt)}
        start = self.position(run[0])[0]
        for load in self._loads_in(anchor, files=True):
            if id(load) in inside or not load.args or self.position(load)[0] <= start:
                continue
            if self._file_of(load.args[0].value) in paths:
                return (
                    "the checkpoint is read back in the same block, before a point every rank "
                    "reaches: save on rank 0, then dist.barrier() where all ranks get, then load"
                )
        return None

    def after_run(self, run: Sequence[cst.BaseStatement]) -> List[cst.BaseStatement]:
        if self._removal(run[0]) is not None:
            func = self.enclosing_function(run[0])
            if func is not None and not self._runs_once(func):
                # (playground's Logger.init(), called by every info(): a barrier there
                # would run per log line, and on rank 0 alone once the callers are guarded)
                self.note(
                    run[0],
                    f"the removal runs on the main process only, with no barrier after it: "
                    f"{func.name.value}() may run more than once, or where not every rank gets; if other "
                    "ranks read that path, add dist.barrier() after the call of it that every rank reaches",
                )
                return []
            return self._barrier_after(
                run[0], "no rank goes on before the main process has removed the path", what="the removal"
            )
        paths = self._run_paths(run)
        if not paths & self._paths_loaded() or self._read_only_before(run[0], paths):
            return []
        return self._barrier_after(run[0], "other ranks read the file later")

    def _read_only_before(self, stmt: cst.BaseStatement, paths: Set[str]) -> bool:
        """Every read of the saved file is earlier in the same function, outside the
        loops around the save (``if os.path.exists(ckpt): ... torch.load(ckpt)`` to
        resume, then saves every N steps): the file is read by a later run, not
        this one -- a barrier after each save would only make every step wait."""
        func = self.enclosing_function(stmt)
        line = self.position(stmt)[0]
        loops = [a for a in self.ancestors(stmt) if isinstance(a, (cst.For, cst.While))]
        loads = [
            c for c in self._loads_in(self.module, files=True)
            if c.args and self._file_of(c.args[0].value) in paths
        ]
        return bool(loads) and self._runs_once(func) and all(
            self.enclosing_function(load) is func
            and self.position(load)[0] < line
            and not any(any(n is load for n in P.walk(loop)) for loop in loops)
            for load in loads
        )

    def _runs_once(self, func: Optional[cst.FunctionDef]) -> bool:
        """Module-level code, or a function of this file that it calls, outside any
        loop, once (``main()``): its earlier statements do not run again."""
        if func is None:
            return True
        if self.enclosing_function(func) is not None:
            return False
        src = self.ast_source
        node = next((f for f in src.tree.body if isinstance(f, ast.FunctionDef) and f.name == func.name.value), None)
        calls = A.calls_of(src, node) if node is not None else []
        return len(calls) == 1 and not any(
            isinstance(a, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef)) for a in src.ancestors(calls[0])
        )

    def _barrier_after(self, stmt: cst.BaseStatement, why: str, what: str = "the save") -> List[cst.BaseStatement]:
        """A barrier after ``stmt`` -- or after the if/with/try that holds it, where
        every rank gets -- so that no rank reads a file rank 0 is still writing."""
        anchor = self._anchor(stmt)
        barrier = cst.parse_statement(f"{self.dist()}.barrier()")
        if anchor is None:
            self.manual(stmt, f"{why}: add dist.barrier() after {what} where every rank reaches it")
            return []
        if self._followed_by_barrier(anchor):
            return []  # (converted before)
        only_main = self._run_by_main_only(stmt)
        if only_main is not None:
            self.manual(
                stmt,
                f"{why}, but {only_main}() runs on the main process only (its calls are, or become, "
                "guarded): a barrier in it would wait forever for the other ranks; add dist.barrier() "
                f"after the guarded call of {only_main}(), where every rank reaches it",
            )
            return []
        self.changed(stmt, f"dist.barrier() after {what}: {why}")
        if anchor is stmt:
            return [barrier]
        self.insert_after(anchor, [barrier])
        return []

    def _followed_by_barrier(self, stmt: cst.CSTNode) -> bool:
        block = self.parent(stmt)
        body = list(getattr(block, "body", ()))
        index = next((i for i, s in enumerate(body) if s is stmt), None)
        if index is None or index + 1 >= len(body):
            return False
        call = single_call(body[index + 1])
        return call is not None and self.is_call(call, N.BARRIER)

    def _run_by_main_only(self, stmt: cst.CSTNode) -> Optional[str]:
        """The name of the function holding ``stmt`` when only the main process
        calls it: every call of it in the file is under a main-process check, or
        is one this transform guards (``model.save_pretrained(path)``)."""
        func = self.enclosing_function(stmt)
        if func is None:
            return None
        name, line = func.name.value, self.position(stmt)[0]
        if name == "save_pretrained":
            return name
        node = next(
            (
                f for f in self.ast_source.of_type(ast.FunctionDef, ast.AsyncFunctionDef)
                if f.name == name and f.lineno <= line <= (f.end_lineno or line)
            ),
            None,
        )
        return name if node is not None and A.called_only_on_main(self.ast_source, node) else None

    def _anchor(self, stmt: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The statement holding ``stmt`` whose block every rank runs: the one
        directly in a function body, the module, or a loop body."""
        current = stmt
        while True:
            block = self.parent(current)
            owner = self.parent(block) if block is not None else None
            if isinstance(block, cst.Module) or isinstance(owner, (cst.FunctionDef, cst.For, cst.While)):
                return current
            if isinstance(owner, (cst.If, cst.With, cst.Try, cst.ExceptHandler, cst.Finally)):
                current = owner
                while isinstance(self.parent(current), (cst.If, cst.Try)) and not isinstance(
                    self.parent(self.parent(current)), (cst.IndentedBlock, cst.Module)
                ):
                    current = self.parent(current)
                continue
            if isinstance(owner, cst.Else):
                current = self.parent(owner)
                continue
            if owner is not None and isinstance(self.parent(owner), cst.If):  # elif chain
                current = self.parent(owner)
                continue
            return None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """``save_checkpoint(...)`` of a function of this file that saves, followed by
        a ``torch.load`` in the same function: the other ranks must wait for rank 0."""
        call = single_call(node)
        if call is None:
            return
        func = call.func
        if isinstance(func, cst.Attribute) and m.matches(func.value, m.Name("self")):
            # a method of this class (``model.train()`` is not ``train()``, nor is an
            # nn.Module's ``self.train()`` the module's ``train()``)
            name = func.attr.value
            cls = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
            body = cls.body.body if cls is not None and isinstance(cls.body, cst.IndentedBlock) else []
            if name not in {f.name.value for f in body if isinstance(f, cst.FunctionDef)} & self._saving_functions():
                return
        elif self._saves(call):  # a function of the module, or a saving object of a class of the file
            name = P.dotted_name(func)
        else:
            return
        if P.under_main_process_check(self, node):
            return
        func = self.enclosing_function(node)
        line = self.position(node)[0]
        if any(self.position(load)[0] > line for load in self._loads_in(func or self.module)):
            barrier = self._barrier_after(node, f"{name}() writes a file that is read below")
            if barrier:
                self.insert_after(node, barrier)

    def _saving_functions(self) -> Set[str]:
        """Functions that save: with a ``torch.save`` of their own, or -- for the
        module's functions -- through another saving function or a saving object
        of a class of the file (``def save_all(): checkpointer.save(model)``)."""
        if getattr(self, "_savers", None) is None:
            self._savers = {
                func.name.value
                for func in P.find(self.module, cst.FunctionDef)
                if any(self.is_call(c, N.TORCH_SAVE) for c in _calls(func))
            }
            functions = [f for f in self.module.body if isinstance(f, cst.FunctionDef)]
            grew = True
            while grew:
                grew = False
                for func in functions:
                    if func.name.value not in self._savers and any(self._saves(c) for c in _calls(func)):
                        self._savers.add(func.name.value)
                        grew = True
        return self._savers

    def _saves(self, call: cst.Call) -> bool:
        """``call`` runs a saving function of the module, or a saving method of an
        object of a class of the file."""
        func = call.func
        if isinstance(func, cst.Name) and func.value in self._saving_functions() and any(
            isinstance(f, cst.FunctionDef) and f.name.value == func.value for f in self.module.body
        ):
            return True
        # ``checkpointer.save(model)``, ``early_stopping(val_loss, model)``: a method (or
        # ``__call__``) that saves, of an object of a class of the file
        owner = func.value if isinstance(func, cst.Attribute) else func
        method = func.attr.value if isinstance(func, cst.Attribute) else "__call__"
        cls = self._class_of_instance(owner) if isinstance(owner, cst.Name) else None
        return cls is not None and method in self._saving_methods(cls)

    def _saving_methods(self, cls: cst.ClassDef) -> Set[str]:
        """The methods of ``cls`` that save, themselves or through another of its
        methods (``__call__`` -> ``self.save_checkpoint(...)``)."""
        body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
        methods = {f.name.value: f for f in body if isinstance(f, cst.FunctionDef)}
        saving = set(methods) & self._saving_functions()
        grew = True
        while grew:
            grew = False
            for name, method in methods.items():
                if name not in saving and any(
                    isinstance(c.func, cst.Attribute) and m.matches(c.func.value, m.Name("self"))
                    and c.func.attr.value in saving
                    for c in _calls(method)
                ):
                    saving.add(name)
                    grew = True
        return saving

    def _class_of_instance(self, name: cst.Name) -> Optional[cst.ClassDef]:
        """The class of this file that ``name`` holds an object of (``name = Cls(...)``,
        its only binding in the function, or the module's)."""
        value = self.only_value(name, pure=False)
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        return next(
            (c for c in self.module.body if isinstance(c, cst.ClassDef) and c.name.value == value.func.value),
            None,
        )

    def _loads_in(self, scope: cst.CSTNode, files: bool = False) -> List[cst.Call]:
        """``torch.load`` calls in ``scope`` -- and, with ``files``, ``open(p)`` to read."""
        return [
            c for c in _calls(scope)
            if self.is_call(c, N.TORCH_LOAD)
            or files and (_reads(c) or self.is_call(c, N.ARTIFACT_READS) or self.is_call(c, W.FRAME_READS))
        ]

    def _run_paths(self, run: Sequence[cst.BaseStatement]) -> Set[str]:
        """The files the statements of a guarded run save to."""
        return {self._save_path(s) for s in run} - {None}

    def _save_path(self, stmt: cst.BaseStatement) -> Optional[str]:
        call = single_call(stmt)
        if self._ast_key(stmt) in self._opened_file_statements() and m.matches(
            stmt, m.SimpleStatementLine(body=[m.Assign(value=m.Call())])
        ):  # f = open(path, "w") ... f.close()
            opened = stmt.body[0].value
            return self._file_of(opened.args[0].value) if opened.args else None
        if call is not None and self.is_call(call, N.TORCH_SAVE) and len(call.args) >= 2:
            return self._file_of(call.args[1].value)
        if isinstance(stmt, cst.With) and (self._with_open_save(stmt) or self._with_open_write(stmt)):
            call = stmt.items[0].item
            # (the path as the loads see it: through a variable assigned once)
            return self._file_of(call.args[0].value) if isinstance(call, cst.Call) and call.args else None
        if call is not None and self._image_save(call):  # Image.fromarray(a).save(path)
            return self._file_of(call.args[0].value) if call.args else None
        if call is not None and self.is_call(call, N.ARTIFACT_WRITES):  # np.save(path, x)
            index = next(N.ARTIFACT_PATH_ARG[q] for q in self.qnames(call.func) if q in N.ARTIFACT_PATH_ARG)
            return self._file_of(call.args[index].value) if len(call.args) > index else None
        if call is not None and self._frame_write(call) is not None:  # df.to_csv(path)
            target = W.frame_target(self._frame_write(call))
            arg = call.args[0] if call.args and call.args[0].keyword is None else next(
                (a for a in call.args if a.keyword is not None and a.keyword.value in W.FRAME_PATH_KEYWORDS), None
            )
            return self._file_of(arg.value) if target is not None and arg is not None else None
        if call is not None and self.is_call(call, N.WRITE_DUMPS):  # json.dump(x, open(path, "w"))
            opened = next((a.value for a in call.args if isinstance(a.value, cst.Call) and _writes(a.value)), None)
            return self._file_of(opened.args[0].value) if opened is not None and opened.args else None
        return None

    def split_write(self, original, updated):
        """``save_image(self.denorm(x_concat.data.cpu()), path)`` on every rank (StarGAN's
        sample grids): what it writes is computed in the call -- user code, maybe a
        collective -- so every rank still computes it, into a name of its own, and only
        the write goes behind the main-process check::

            image = self.denorm(x_concat.data.cpu())
            if dist.get_rank() == 0:
                save_image(image, path)
        """
        computed = self._computed_arguments(original)
        if not computed:
            return None
        call, new_call = single_call(original), single_call(updated)
        if new_call is None or len(new_call.args) != len(call.args):
            return None
        scope = self.enclosing_function(original) or self.module
        given = self._split_names.setdefault(scope, set())
        taken = {n.value for n in P.find(scope, cst.Name)} | given
        base = "image" if "image" in P.dotted_name(call.func).lower() or "imsave" in P.dotted_name(call.func) else "data"
        statements, args = [], list(new_call.args)
        for index in computed:
            name = next(n for n in (base, *(f"{base}_{i}" for i in range(2, 100))) if n not in taken)
            taken.add(name)
            given.add(name)
            statements.append(cst.SimpleStatementLine(
                body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=args[index].value)]
            ))
            args[index] = args[index].with_changes(value=cst.Name(name))
        statements[0] = statements[0].with_changes(leading_lines=updated.leading_lines)
        write = updated.with_changes(
            body=[updated.body[0].with_changes(value=new_call.with_changes(args=args))], leading_lines=[]
        )
        what = P.dotted_name(call.func) or "the write"
        return statements, write, (
            f"{what} writes on the main process only (every rank would write the same file); what it "
            "writes is still computed on every rank, before it"
        )

    def _computed_arguments(self, stmt: cst.BaseStatement) -> List[int]:
        """The positions of the computed (not pure) arguments of a write of an artifact
        that every rank would write, where each may be computed on its own first."""
        call = single_call(stmt)
        if (
            call is None or not self.is_call(call, N.ARTIFACT_WRITES) or self._per_rank_path(call)
            or P.under_main_process_check(self, call) or self._run_by_main_only(stmt)
            or any(a.star for a in call.args) or not self.guardable_block(self.parent(stmt))
        ):
            return []
        return [i for i, a in enumerate(call.args) if not P.is_pure(a.value)]

    def _report_computed_write(self, stmt: cst.BaseStatement, call: cst.Call) -> None:
        """``save_image(self.denorm(x), path)`` on every rank: its argument calls
        something (user code: maybe a collective, a DDP forward), so the statement
        is not moved under the main process -- and every rank writes the same file:
        reported (StarGAN's sample grids)."""
        if (
            stmt in self._computed_writes or P.under_main_process_check(self, call) or self._run_by_main_only(stmt)
            or self._computed_arguments(stmt)
        ):
            return  # (guarded, or split: split_write)
        self._computed_writes.add(stmt)
        name = P.dotted_name(call.func) or "the write"
        self.manual(
            stmt,
            f"{name} runs on every rank (the same file from each), and what it writes is computed in "
            "the call: compute it on every rank first (x = ...), then write it under `if "
            "dist.get_rank() == 0:`",
            code="DDP302",
        )

    def _handler_statements(self) -> Set[Tuple[int, int]]:
        """(line, column) of ``fh = logging.FileHandler(p)`` and the statements that
        use ``fh`` (``_analysis.file_handler_statements``)."""
        if self._file_handlers is None:
            self._file_handlers = {(st.lineno, st.col_offset) for st in A.file_handler_statements(self.ast_source)}
        return self._file_handlers

    def _opened_file_statements(self) -> Set[Tuple[int, int]]:
        """(line, column) of ``f = open(p, "a")`` and the statements that fill and close
        it (``_analysis.opened_file_statements``)."""
        if self._opened_files is None:
            self._opened_files = {(st.lineno, st.col_offset) for st in A.opened_file_statements(self.ast_source)}
        return self._opened_files

    def _file_handler_added(self, call: cst.Call) -> bool:
        """``logger.addHandler(logging.FileHandler(path))``, ``logging.basicConfig(filename=path)``:
        the file is opened for appending by every rank that runs it (``_analysis.file_handler_added``)."""
        node = self.ast_call(call) if isinstance(call.func, cst.Attribute) and call.func.attr.value in (
            "addHandler", "basicConfig"
        ) else None
        return node is not None and A.file_handler_added(self.ast_source, node)

    def _image_save(self, call: cst.Call) -> bool:
        """A Pillow image's ``.save(path)`` (``_analysis.is_image_save``, shared with lint)."""
        node = self.ast_call(call) if isinstance(call.func, cst.Attribute) and call.func.attr.value == "save" else None
        return node is not None and A.is_image_save(self.ast_source, node)

    def _opened(self, item: cst.WithItem) -> Optional[str]:
        """``P`` of ``with open(P, ...) as f``."""
        call = item.item
        if isinstance(call, cst.Call) and call.args:
            return self.module.code_for_node(call.args[0].value)
        return None

    def _file_of(self, expr: cst.BaseExpression) -> str:
        """The path behind a file object: ``f`` of ``with open(P) as f`` is ``P``;
        behind a variable assigned once: ``best_path = os.path.join(d, "best.pt")``."""
        if isinstance(expr, cst.Name):
            for anc in self.ancestors(expr):
                if isinstance(anc, cst.With):
                    for item in anc.items:
                        if item.asname is not None and P.dotted_name(item.asname.name) == expr.value:
                            opened = self._opened(item)
                            if opened is not None:
                                return opened
            value = self.only_value(expr)
            if value is not None:
                return self.module.code_for_node(value)
        return self.module.code_for_node(expr)

    def _paths_loaded(self) -> Set[str]:
        if self._loaded_paths is None:
            self._loaded_paths = {
                self._file_of(call.args[0].value)
                for call in self._loads_in(self.module, files=True)
                if call.args
            }
        return self._loaded_paths



def _writes(call: cst.Call) -> bool:
    """``open(p, "w")``, ``open(p, mode="a")``...: a literal mode that writes."""
    mode = _mode(call)
    if mode is None or not isinstance(mode.value, cst.SimpleString):
        return False
    return any(c in mode.value.evaluated_value for c in "wax+")


def _reads(call: cst.Call) -> bool:
    """``open(p)`` / ``open(p, "r")``: the file read back."""
    return m.matches(call.func, m.Name("open")) and bool(call.args) and not _writes(call) and _literal_mode(call)


def _literal_mode(call: cst.Call) -> bool:
    """The mode of ``open(...)`` is the default or a string literal."""
    mode = _mode(call)
    return mode is None or isinstance(mode.value, cst.SimpleString)


def _mode(call: cst.Call) -> Optional[cst.Arg]:
    mode = call.args[1] if len(call.args) > 1 and call.args[1].keyword is None else None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "mode":
            mode = arg
    return mode


def _calls(node: cst.CSTNode) -> List[cst.Call]:
    return P.find(node, cst.Call)
