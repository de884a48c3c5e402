"""DDP301 output-on-every-rank."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .. import _writes as W
from .._analysis import (
    Source,
    last_name,
    is_main_process_check,
    is_not_main_check,
    is_pure,
    prints_to_a_rank_file,
    dotted,
    is_rank_expr,
    on_main_process_only,
    uses_distributed,
)
from .._program import imported_facts, made_outside_the_project, runs_only_on_main_by_its_callers
from ._base import Diagnostic, Rule


class OutputOnEveryRank(Rule):
    """
    ## What it does
    In DDP code, reports `print(...)`, `logging.info/debug(...)` and
    `logger.info/debug(...)` that run on every rank (not under a main-process
    check). A message that names the rank (`print(f"rank {rank}: ...")`) is
    meant per rank and is not reported; nor is output in a function called only
    under a main-process check, in the non-distributed branch (`else:` of `if
    args.distributed:`), or logging whose level depends on the rank
    (`basicConfig(level=INFO if rank in [-1, 0] else WARN)`). Output that the
    program already makes rank-aware is not reported either: `print` where the
    file or a module it imports replaces `builtins.print` under a condition
    (`setup_for_distributed(is_master)` of DETR, DeiT, MAE, DINO), logging where
    the file or a module it imports adds the handlers on the main process only
    or filters by rank, and a logger made by a factory told the rank
    (`setup_logger(out, distributed_rank=rank)`); a logger handed in as a
    parameter is judged where it is made. Nor are the last words of a process
    (a message just before `sys.exit()` or `raise`) and a message that names the
    process (`os.getpid()`). Also a `wandb.init(...)` or a TensorBoard
    `SummaryWriter(...)` made on every rank (not on the main process, nor
    `... if rank == 0 else None`; a `wandb.init(mode=...)` chooses per rank itself).
    (A use on every rank of an object made on the main process only is DDP309.)

    Off by default: on the lint set of real DDP repositories most of its false
    findings were output that the project's own set-up silences on the other
    ranks in ways it cannot follow; select it (`--extend-select DDP301`) to see them.

    ## Why is this bad?
    Every process runs the same code, so the log shows every line N times,
    interleaved. Progress belongs to the main process; warnings and errors may
    come from any rank. A wandb run or a TensorBoard writer per rank gives N runs
    in the dashboard, or N event files in one folder, each with a shard's numbers.

    ## Example
    ```python
    print(f"epoch {epoch}: loss {loss:.3f}")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: loss {loss:.3f}")
    ```

    ## Fix safety
    Safe: the computation is unchanged; only the other ranks' copies of the
    output disappear. Output whose arguments call into user code (which might
    run the model, a collective) is not moved. A use of an object made on the
    main process only has no fix here (convert guards the uses of the writers
    it makes so, or reports them).
    """

    # off by default: on the lint set its findings were 64% true (65 of 101 judged), most of
    # the false ones output that a project's own set-up silences on the other ranks
    DEFAULT = False
    CODE = "DDP301"
    NAME = "output-on-every-rank"
    SEVERITY = "info"
    MESSAGE = "printed by every rank: print/log progress from the main process only"
    RUN_MESSAGE = (
        "every rank starts its own {what}: N copies, each with one shard's numbers; "
        "create it on the main process only (None or wandb.init(mode=\"disabled\") on the others)"
    )
    FIX = "safe"
    FIX_TRANSFORMS = ("output-on-main",)
    FIX_DESCRIPTION = "put the output behind `if dist.get_rank() == 0:`"
    TRIGGERS = (
        ("print", "istributed"), ("echo", "istributed"), ("info", "istributed"), ("debug", "istributed"),
        ("wandb", "istributed"), ("SummaryWriter", "istributed"),
    )

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        names = W.main_only_names(src, W.main_only_bindings(src))  # (their uses: DDP309)
        loggers = _loggers(src)
        rank_made_loggers = _rank_made_loggers(src)
        main_only: dict = {}  # function -> called only on the main process
        for call in src.calls:
            what = _per_rank_sink(src, call)
            if what:
                found = self.diagnostic(src, call, self.RUN_MESSAGE.format(what=what))
                if what == "wandb run" and not _only_logged(src, call):
                    found.fix = None  # convert leaves it for a human: --fix would change nothing
                yield found
                continue
            if not isinstance(src.parent(call), ast.Expr):
                continue
            name = src.qualname(call.func)
            printed = name in N.PRINT and not prints_to_a_rank_file(src, call)
            logged = name in N.LOGGING_CHATTER or (
                isinstance(call.func, ast.Attribute)
                and call.func.attr in N.LOGGER_CHATTER_METHODS
                and (
                    isinstance(call.func.value, ast.Name) and call.func.value.id in loggers
                    or N.is_logger_name(dotted(call.func.value))
                )
                and dotted(call.func.value) not in rank_made_loggers
            )
            if not (printed or logged) or src.function_of(call) is None and not _in_main_block(src, call):
                continue
            output = imported_facts(src)  # (the file's and its imports': read once)
            if printed and output.rank_aware_print or logged and output.rank_aware_logging:
                # ``setup_for_distributed(is_master)`` replaced print; rank-0 handlers, a level
                # chosen by the rank (``basicConfig(level=INFO if rank in [-1, 0] else WARN)``)
                continue
            if any(is_rank_expr(src, n) or _names_the_process(src, n) for arg in call.args for n in ast.walk(arg)):
                continue
            if logged and _handed_in(src, call.func):
                continue  # ``def load_checkpoint(..., logger)``: judged where the logger is made
            if logged and isinstance(call.func.value, ast.Name) and made_outside_the_project(src, call.func.value.id):
                continue  # an installed package's logger (yolov5's LOGGER, ultralytics': rank 0 only)
            if _before_exit(src, call):
                continue  # the last words of a process that stops: any rank may say them
            func = src.function_of(call)
            if func is not None:
                if func not in main_only:  # (here, or by the files that import this one: EDM's misc.py)
                    main_only[func] = runs_only_on_main_by_its_callers(src, call)
                if main_only[func]:
                    continue  # ``if self.gpu_id == 0: self._save_snapshot(epoch)``
            if W.checked_present(src, call, names):
                continue  # ``if best_metric is not None:``, set where the main process's saver is (timm)
            if _not_distributed_branch(src, call):
                continue  # the non-distributed branch of ``if args.distributed: ... else:``
            if not on_main_process_only(src, call):
                found = self.diagnostic(src, call)
                if not all(is_pure(a) for a in (*call.args, *(k.value for k in call.keywords))):
                    found.fix = None  # it computes (maybe a collective): convert leaves it
                yield found


def _per_rank_sink(src: Source, call: ast.Call) -> str:
    """``wandb.init(...)`` / ``SummaryWriter(...)`` that every rank runs: what it makes."""
    name = src.qualname(call.func)
    if name in N.WANDB_INIT:
        if any(k.arg == "mode" for k in call.keywords):
            return ""  # ``mode="disabled" if rank else None``: chosen per rank
        what = "wandb run"
    elif name in N.SUMMARY_WRITER:
        what = "TensorBoard writer"
    else:
        return ""
    if src.function_of(call) is None and not _in_main_block(src, call):
        return ""  # at import time: where the process group is not up yet
    parent = src.parent(call)
    if isinstance(parent, ast.IfExp) and (
        is_main_process_check(src, parent.test) or is_not_main_check(src, parent.test)
    ):
        return ""  # ``SummaryWriter(d) if rank == 0 else None``
    if on_main_process_only(src, call) or runs_only_on_main_by_its_callers(src, call):
        return ""  # (``log_writer = utils.TensorboardLogger(d)`` under ``if rank == 0:``, ConvNeXt)
    return what


def _only_logged(src: Source, call: ast.Call) -> bool:
    """The run of ``run = wandb.init(...)`` is used only as the receiver of whole
    statements (``run.log({...})``): what convert's output-on-main guards."""
    assign = src.parent(call)
    if isinstance(assign, ast.IfExp) and assign.body is call:
        assign = src.parent(assign)  # run = wandb.init() if use_wandb else None
    if not isinstance(assign, ast.Assign) or not all(isinstance(t, ast.Name) for t in assign.targets):
        return isinstance(assign, ast.Expr)
    for target in assign.targets:
        uses = [n for n in src.of_type(ast.Name) if n.id == target.id]
        for use in uses:
            parent = src.parent(use)
            if isinstance(use.ctx, ast.Store) and isinstance(parent, ast.Assign):
                continue
            if isinstance(parent, ast.Compare) and parent.left is use and len(parent.ops) == 1 and isinstance(
                parent.ops[0], (ast.Is, ast.IsNot)
            ) and isinstance(parent.comparators[0], ast.Constant) and parent.comparators[0].value is None:
                continue  # ``if run is not None:``
            if isinstance(parent, ast.If) and parent.test is use:
                continue  # ``if run:``
            call_of = src.parent(parent) if isinstance(parent, ast.Attribute) else None
            if not (isinstance(call_of, ast.Call) and call_of.func is parent and isinstance(src.parent(call_of), ast.Expr)):
                return False
    return True


def _not_distributed_branch(src: Source, node: ast.AST) -> bool:
    """``node`` runs only without DDP: the ``else`` of ``if args.distributed:`` /
    ``if dist.is_initialized():``, or the body of their negation."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.If):
            test = anc.test
            negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            inner = test.operand if negated else test
            word = last_name(inner.func if isinstance(inner, ast.Call) else inner).lower() if isinstance(
                inner, (ast.Name, ast.Attribute, ast.Call)
            ) else ""
            launched = (  # ``"RANK" in os.environ``: started by a launcher
                isinstance(inner, ast.Compare) and isinstance(inner.left, ast.Constant)
                and inner.left.value in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")
                and len(inner.ops) == 1 and isinstance(inner.ops[0], ast.In)
            )
            if "distributed" in word or word == "is_initialized" or launched:
                if (child in anc.orelse) != negated:
                    return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = anc
    return False


def _loggers(src: Source) -> set:
    names = set()
    for node in src.nodes:
        if isinstance(node, ast.Assign) and src.is_call(node.value, N.LOGGER_FACTORY):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _names_the_process(src: Source, node: ast.AST) -> bool:
    """``os.getpid()``, ``socket.gethostname()``: output meant per process."""
    return isinstance(node, ast.Call) and src.qualname(node.func) in ("os.getpid", "socket.gethostname")


def _handed_in(src: Source, func: ast.AST) -> bool:
    """``logger.info`` where ``logger`` is a parameter of the enclosing function."""
    receiver = func.value if isinstance(func, ast.Attribute) else None
    scope = src.function_of(func)
    if not isinstance(receiver, ast.Name) or scope is None or not hasattr(scope, "args"):
        return False
    params = scope.args
    return receiver.id in {a.arg for a in (*params.posonlyargs, *params.args, *params.kwonlyargs)}


def _before_exit(src: Source, call: ast.Call) -> bool:
    """The statement after ``print(...)`` ends the process: ``sys.exit(1)``,
    ``exit()``, ``raise``."""
    statement = src.parent(call)
    block = src.parent(statement)
    for field in ("body", "orelse", "finalbody"):
        body = getattr(block, field, None)
        if isinstance(body, list) and statement in body:
            following = body[body.index(statement) + 1:]
            if not following:
                return False
            nxt = following[0]
            if isinstance(nxt, ast.Raise):
                return True
            return isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Call) and src.qualname(
                nxt.value.func
            ) in ("sys.exit", "builtins.exit", "builtins.quit", "exit", "quit", "os._exit")
    return False


def _rank_made_loggers(src: Source) -> set:
    """Loggers made by a factory told the rank: ``logger = setup_logger(out,
    distributed_rank=comm.get_rank())`` (detectron2, maskrcnn-benchmark),
    ``self.logger = create_logger(cfg, rank)``: their handlers follow the rank."""
    names = set()
    for node in src.of_type(ast.Assign):
        value = node.value
        if not isinstance(value, ast.Call) or "logger" not in last_name(value.func).lower():
            continue
        arguments = (*value.args, *(k.value for k in value.keywords))
        if any(is_rank_expr(src, sub) for arg in arguments for sub in ast.walk(arg)) or any(
            k.arg and "rank" in k.arg for k in value.keywords
        ):
            names.update(filter(None, (dotted(t) for t in node.targets)))
    return names


def _in_main_block(src: Source, node: ast.AST) -> bool:
    from .._facts import is_main_guard

    return any(is_main_guard(a) for a in src.ancestors(node))
