"""The convert engine: pure functions from source bytes to converted bytes + findings.

``convert_sources`` takes every file of the program at once, because a
migration is a property of the program: the process group is set up at the
entry point, the loader that needs a ``DistributedSampler`` may be built in
another module, and output guards belong only in code that runs after the
process group is up.  For each file it:

1. skips files that cannot matter (no ``torch`` in the text) without parsing;
2. parses with LibCST (a syntax error is reported with its line, file untouched);
3. decides the file's role from per-file facts and the import graph;
4. runs the transforms of ``codemods`` in order (each one a LibCST codemod);
5. formats, black-style, only the statements it changed that are too long;
6. checks that the result parses and that converting it again changes nothing.

Nothing here touches the file system; the CLI reads and writes.
"""

from __future__ import annotations

import ast
import difflib
import functools
import gc
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from dp2ddp.codemods import _names as N
from dp2ddp.codemods._model import (
    MARKER,
    SPELLED_MARKS,
    FileRole,
    Finding,
    Settings,
    is_local_data_parallel_note,
    local_data_parallel_note,
)
from dp2ddp.codemods._analysis import Source, decode
from dp2ddp.codemods._bridge import character_column
from dp2ddp.codemods._facts import FileFacts, collect_facts, import_facts
from dp2ddp.codemods._program import module_files, package_folder  # (shared with lint)
from dp2ddp import linediff

#: ``progress(done, total)``: how many of a pass's files are done
Progress = Callable[[int, int], None]
#: ``progress(phase, done, total)``, the phase "converting" or "checking"
PhaseProgress = Callable[[str, int, int], None]

if TYPE_CHECKING:  # (LibCST is imported when a file is converted, not before)
    import libcst as cst


class InternalError(Exception):
    """A bug in dp2ddp (a transform crashed or produced bad code)."""


@dataclass
class FileResult:
    path: str
    source: bytes
    output: Optional[bytes] = None
    findings: List[Finding] = field(default_factory=list)
    #: "path:line:col: message" when the file could not be converted
    error: Optional[str] = None
    #: True when the error is a bug in dp2ddp rather than in the input
    internal: bool = False
    role: Optional[FileRole] = None
    skipped: bool = False
    #: what ``dp2ddp lint`` still reports on the output at its default --fail-on,
    #: "line:col: CODE message" in the output's lines (``self_check.SelfCheck``)
    still_linted: List[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.output is not None and self.output != self.source


@dataclass
class ConvertResult:
    files: List[FileResult]

    @property
    def entries(self) -> List[FileResult]:
        return [f for f in self.files if f.role is not None and f.role.is_entry]

    @property
    def changed(self) -> List[FileResult]:
        return [f for f in self.files if f.changed]

    @property
    def errors(self) -> List[FileResult]:
        return [f for f in self.files if f.error is not None]


def may_matter(data: bytes) -> bool:
    """Cheap prefilter: only files that mention torch can need a change; one that
    calls a DataParallel of its own gets a note, and a script's ``__main__`` block
    may be the entry point of a torch program without naming torch itself."""
    return b"torch" in data or b"DataParallel" in data or b"__main__" in data


# ------------------------------------------------------------------ program roles
def _resolve_imports(paths: Sequence[str], facts: Mapping[str, FileFacts]) -> Dict[str, Set[str]]:
    """Which of the given files each file imports (the program's import graph).

    ``import data`` from ``train.py`` is the ``data.py`` beside it (a script's folder
    is on ``sys.path``), or a package module under any ancestor folder
    (``import pkg.data`` -> ``pkg/data.py``); relative imports resolve from the
    file's package.
    """
    known = {os.path.normpath(p): p for p in paths}
    # folders that hold a given file, at any depth: a module can only be found
    # below one of them (saves most of the lookups of ``import torch.nn`` & co.)
    folders = {""}
    for p in known:
        folder = os.path.dirname(p)
        while folder and folder not in folders:
            folders.add(folder)
            folder = os.path.dirname(folder)
    folders.add(".")  # (what os.path.normpath makes of "")
    memo: Dict[Tuple[str, str], Set[str]] = {}

    def lookup(folder: str, dotted: str) -> Set[str]:
        key = (folder, dotted)
        if key in memo:
            return memo[key]
        found: Set[str] = set()
        memo[key] = found
        parts = [p for p in dotted.split(".") if p]
        if not parts or os.path.normpath(os.path.join(folder, *parts[:-1])) not in folders:
            return found
        for candidate in module_files(folder, dotted):
            hit = known.get(candidate)
            if hit is not None:
                found.add(hit)
        return found

    # folders some file of the program puts on sys.path (a process-wide setting)
    roots = sorted(
        {
            os.path.normpath(os.path.join(os.path.dirname(os.path.normpath(p)), root))
            for p in paths
            for root in facts[p].path_roots
        }
        & folders  # (only folders that hold some of the files)
    )
    graph: Dict[str, Set[str]] = {}
    for path in paths:
        targets: Set[str] = set()
        folder = os.path.dirname(os.path.normpath(path))
        ancestors = [folder]
        while True:
            parent = os.path.dirname(ancestors[-1])
            if parent == ancestors[-1] or not parent:
                break
            ancestors.append(parent)
        if folder:
            ancestors.append("")
        ancestors += [r if r != "." else "" for r in roots if r not in ancestors]
        for name in facts[path].imports:
            for base in ancestors:
                hits = lookup(base, name)
                if hits:
                    targets |= hits
                    break
        for level, name in facts[path].relative_imports:
            base = package_folder(folder, level)
            targets |= lookup(base, name) if name else lookup(base, "__init__")
        graph[path] = targets - {path}
    return graph


def assign_roles(
    facts: Mapping[str, FileFacts],
    explicit: Optional[Set[str]] = None,
    passthrough: Optional[Mapping[str, FileFacts]] = None,
) -> Dict[str, FileRole]:
    """Each file's role in the program (see ``FileRole``).

    An entry point is a file whose ``__main__`` block, or module-level code,
    leads to training (an optimizer or a ``backward()`` in it or in what it
    imports) *and* whose program uses DataParallel or a DataLoader -- there is
    something to distribute -- or that the user named explicitly.  The program is the entries plus every file they
    import, transitively.  With no entry among the files given (a library
    folder), the files that wrap with DataParallel or build DataLoaders are the
    program, since some script outside will run them -- and so is a file the user
    named explicitly (``explicit``; None: every file).  ``passthrough``: files that
    do not use torch (never converted, given no role) whose imports still link the
    graph -- a package ``__init__.py`` that re-exports a module's function.
    """
    linked = {**(passthrough or {}), **facts}
    graph = _resolve_imports(list(linked), linked)
    closures: Dict[str, Set[str]] = {}

    def closure(start: str) -> Set[str]:
        if start not in closures:
            closures[start] = _program(start, graph)
        return closures[start]

    def convertible(files: Set[str]) -> bool:
        return any(linked[p].has_data_parallel or linked[p].has_data_loader for p in files)

    entries: Dict[str, str] = {}
    for path, f in facts.items():
        if not (f.module_level_trains or f.has_main_guard):
            continue
        reach = closure(path)
        if not convertible(reach) and not (explicit is None or path in explicit):
            continue
        if f.module_level_trains:
            entries[path] = "module"
        elif any(linked[p].trains for p in reach):
            entries[path] = "main-block"
    library_mode = not entries
    roles = {}
    for path, f in facts.items():
        owners = [e for e in entries if path in closure(e)]
        program = {p for e in owners for p in closure(e)}
        named = explicit is None or path in explicit
        # in a library (no entry point among the files), a script of its own -- a
        # __main__ block that does not lead to training, e.g. an evaluation -- is not
        # program code that some training script will run
        in_program = bool(owners) or library_mode and not f.has_main_guard and (
            f.has_data_parallel or f.has_data_loader or named
        )
        roles[path] = FileRole(
            is_entry=path in entries,
            entry_kind=entries.get(path, ""),
            in_program=in_program,
            # (a program that wraps in DDP somewhere already is not wrapped again)
            single_device=bool(owners)
            and not any(linked[p].has_data_parallel or linked[p].wraps_ddp for p in program),
            no_optimizer=bool(owners) and not any(linked[p].builds_optimizer for p in program),
            program_batchnorm=any(linked[p].builds_batchnorm for p in program),
            program_loads_data=any(linked[p].has_data_loader for p in program),
            program_state_dict=any(linked[p].uses_state_dict for p in program),
            program_batches_per_process=tuple(sorted(
                set().union(*(linked[p].in_batch_label_batches for p in program))
                & set().union(*(linked[p].loader_batch_names for p in program))
            )),
            already_distributed=f.already_distributed
            or any(facts[e].already_distributed for e in owners),
            set_up_by_dp2ddp="dp2ddp" in {facts[p].setup for p in (path, *owners)}
            and "hand" not in {facts[p].setup for p in (path, *owners)},
            program_optimizer_methods=tuple(sorted(set().union(*(linked[p].optimizer_methods for p in program)))),
            program_forward_tests_none=any(linked[p].forward_tests_none for p in program),
            imported_model_functions=_imported_model_functions(graph.get(path, ()), linked),
            imported_writing_functions=tuple(name for name, _ in _imported_by_name(
                graph.get(path, ()), {p: dict.fromkeys(linked[p].writing_functions, True) for p in linked}
            )),
            imported_state_dict_savers=_imported_by_name(
                graph.get(path, ()), {p: linked[p].state_dict_savers for p in linked}
            ),
        )
    return roles


def _imported_model_functions(imported: Iterable[str], facts: Mapping[str, FileFacts]) -> tuple:
    """``FileRole.imported_model_functions`` of a file that imports ``imported``."""
    return _imported_by_name(imported, {p: facts[p].model_attribute_functions for p in facts})


def _imported_by_name(imported: Iterable[str], tables: Mapping[str, Mapping[str, object]]) -> tuple:
    """The entries of ``tables`` (path -> {name: what}) of the modules ``imported``,
    by name, sorted -- a name two of them define differently is left out."""
    found: Dict[str, object] = {}
    ambiguous: Set[str] = set()
    for path in sorted(imported):
        for name, function in tables[path].items():
            if found.get(name, function) != function:
                ambiguous.add(name)
            found[name] = function
    return tuple(sorted((n, f) for n, f in found.items() if n not in ambiguous))


# ------------------------------------------------------------------ line mapping
class LineMap:
    """Maps line numbers of an intermediate text back to the original text."""

    def __init__(self, original: str, current: str) -> None:
        self._same = original == current
        if not self._same:
            a, b = original.splitlines(), current.splitlines()
            self._ops = linediff.opcodes(a, b)
            self._len = len(a)
            self._a, self._b = a, b

    def __call__(self, line: int) -> int:
        return self.position(line, 1)[0]

    def position(self, line: int, column: int) -> Tuple[int, int]:
        """(line, column) in the original text of a position in the current one."""
        if self._same or line <= 0:
            return line, column
        index = line - 1
        for tag, i1, i2, j1, j2 in self._ops:
            if j1 <= index < j2 or (tag == "insert" and index == j1):
                if tag == "equal":
                    return i1 + (index - j1) + 1, column
                # a changed region: the original line that holds this line's code (a
                # statement spelled out of ``a; b``, or put under a check), else its first
                current = self._b[index] if index < len(self._b) else ""
                text = SPELLED_MARKS.sub("", current).strip()
                if len(text) >= 4:
                    for i in range(i1, i2):
                        at = self._a[i].find(text)
                        if at >= 0:
                            indent = len(current) - len(current.lstrip())
                            return i + 1, max(1, at + column - indent)
                return min(i1 + 1, max(self._len, 1)), column
        return line, column


def _to_file(findings: Sequence[Finding], to_file: LineMap, start_code: str, code: str) -> None:
    """Put the findings of a transform that saw ``code`` at their places in the file:
    through the transforms' edits since ``start_code``, then through ``to_file``
    (the respelling of one-line forms)."""
    line_map = LineMap(start_code, code)
    for finding in findings:
        finding.line, finding.column = to_file.position(line_map(finding.line), finding.column)


# ------------------------------------------------------------------ the pipeline
def _parse(path: str, data: bytes) -> cst.Module:
    import libcst as cst

    return cst.parse_module(data)


def syntax_error(path: str, exc: Exception) -> str:
    cst = sys.modules.get("libcst")  # not loaded: the error cannot be LibCST's
    if cst is not None and isinstance(exc, cst.ParserSyntaxError):
        return f"{path}:{exc.raw_line}:{exc.raw_column + 1}: cannot parse: {exc.message}"
    if isinstance(exc, UnicodeDecodeError):
        from dp2ddp.codemods._analysis import decode_position

        line, column = decode_position(exc)
        return f"{path}:{line}:{column}: cannot decode ({exc.encoding}): {exc.reason} at byte {exc.start}"
    if isinstance(exc, SyntaxError):
        return f"{path}:{exc.lineno or 1}:{exc.offset or 1}: cannot parse: {exc.msg}"
    return f"{path}:1:1: cannot parse: {exc}"


def deepest_statement(data: bytes) -> Tuple[int, int]:
    """(line, column), 1-based, of the statement that holds the most deeply nested
    node of the file's ``ast`` (where a recursive walk runs out of stack: a
    2,500-term expression); (1, 1) when CPython cannot parse it either.  Walked
    with a stack of its own."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1, 1
    where = _deepest_statement_node(tree)
    line, offset = (where.lineno, where.col_offset) if where is not None else (1, 0)
    return line, character_column(decode(data).splitlines(), line, offset)  # (ast counts UTF-8 bytes)


def _deepest_statement_node(tree: ast.AST) -> Optional[ast.stmt]:
    """The statement that holds the most deeply nested node of ``tree`` (None for
    an empty module), walked with a stack of its own."""
    best, where = -1, None
    stack: List[tuple] = [(tree, 0, None)]
    while stack:
        node, depth, statement = stack.pop()
        if isinstance(node, ast.stmt):
            statement = node
        if depth > best:
            best, where = depth, statement
        stack.extend((child, depth + 1, statement) for child in ast.iter_child_nodes(node))
    return where


#: what ``_too_deep``'s error says (``_convert_one_file`` holds such statements back)
_TOO_DEEP = "too deeply nested to"


def _too_deep(path: str, data: bytes, what: str) -> str:
    line, column = deepest_statement(data)
    return f"{path}:{line}:{column}: {_TOO_DEEP} {what} (this statement); left unchanged"


def _check_compiles(path: str, data: bytes) -> None:
    ast.parse(data, filename=path)


def run_transforms(
    path: str,
    module: cst.Module,
    role: FileRole,
    settings: Settings,
    skip: frozenset = frozenset(),
    original_code: Optional[str] = None,
) -> tuple:
    """Apply every transform that applies to ``role``; return (module, findings).

    A transform whose ``TRIGGERS`` (words or patterns) do not occur in the current code cannot
    change anything and is skipped without building its metadata.  Every change
    a transform makes comes with a finding (nothing is converted silently), so a
    transform without "change" or "manual" findings left the code as it was: its
    output is dropped and the next transform reuses the same metadata.
    ``skip``: transforms the file's ``ast`` facts show have nothing to do.
    ``original_code``: the file as written, when ``module`` is a respelling of
    it (one-line forms spelled out): the findings' lines are the file's."""
    from libcst.codemod import CodemodContext

    from dp2ddp.codemods import TRANSFORMS
    from dp2ddp.codemods._base import apply_scheduled_imports

    findings: List[Finding] = []
    code = module.code
    # lines of the code a transform saw -> lines of the module handed in -> the file's
    # (two steps: the respelling and the transforms' edits each align well alone)
    to_file = LineMap(original_code if original_code is not None else code, code)
    start_code = code
    wrapper = None
    # one context for all: the imports they schedule are applied once, at the end
    context = CodemodContext(filename=path)
    for transform_cls in TRANSFORMS:
        if not transform_cls.applies_to(role) or transform_cls.NAME in skip:
            continue
        triggers = transform_cls.TRIGGERS
        if triggers and not any(
            t.search(code) if hasattr(t, "search") else t in code for t in triggers
        ):
            continue
        transform = transform_cls(context, settings, role)
        transform.shared_wrapper = wrapper
        try:
            new_module = transform.transform_module(module, apply_imports=False)
        except RecursionError:
            raise  # nesting deeper than the visitors can go: the file is left unchanged
        except Exception as exc:  # a bug in a transform
            raise InternalError(
                f"{path}: transform {transform_cls.NAME} crashed: {exc!r}\n{traceback.format_exc()}"
            ) from exc
        _to_file(transform.findings, to_file, start_code, code)
        for finding in transform.findings:
            finding.path = path
            findings.append(finding)
        if any(f.kind in ("change", "manual") for f in transform.findings):
            module = new_module
            code = module.code
            wrapper = None
        else:
            wrapper = transform.shared_wrapper
    try:
        module = apply_scheduled_imports(context, module)
    except Exception as exc:  # pragma: no cover - a bug in LibCST's import helpers or ours
        raise InternalError(f"{path}: adding the imports crashed: {exc!r}\n{traceback.format_exc()}") from exc
    return module, findings


def _nothing_to_do(facts: FileFacts) -> frozenset:
    """Transforms that cannot change a file, by what its ``ast`` says (cheaper
    than their LibCST pass, which resolves scopes first): no name that resolves
    to DataParallel or data_parallel, no import of them, and no class of its own
    of that name."""
    if facts.mentions_data_parallel or facts.local_data_parallel or facts.imports & N.ANY_DATA_PARALLEL:
        return frozenset()  # (an unused import of DataParallel is removed, too)
    return frozenset({"data-parallel-to-ddp"})


def _not_round_tripped(path: str, data: bytes, again: bytes) -> str:
    """LibCST must give back the file byte for byte before anything is changed
    (it drops, e.g., a form feed before an indented line): otherwise the file is
    left alone rather than rewritten with losses."""
    line = 1
    for index, (a, b) in enumerate(zip(data, again)):
        if a != b:
            line = data.count(b"\n", 0, index) + 1
            break
    if b"\r" in data and b"\n" not in data:
        return (
            f"{path}:1:1: the file ends its lines with CR alone (old Mac OS line endings), which "
            "LibCST cannot reproduce: convert them to LF (or CRLF) first; left unchanged"
        )
    return (
        f"{path}:{line}:1: LibCST cannot reproduce this file byte for byte (a form feed or "
        "an unusual character here?): left unchanged"
    )


#: the cyclic collector's thresholds while a file is converted: LibCST makes and
#: drops millions of small objects per transform, and with the default (700, 10, 10)
#: the full collections that a large heap triggers took 11% of a 10,000-line
#: file's conversion, growing with the file (benchmarks/convert_scale.py: 102 s ->
#: 91 s, peak memory 378 -> 395 MB)
_CONVERT_GC_THRESHOLDS = (20_000, 10, 10)


def _convert_one(job) -> tuple:
    """Convert one file of the program (runs in a worker process with -j):
    returns (path, output, findings, error, internal, lasting).  ``lasting``:
    the result follows from the job alone -- not so when the stack or the memory
    ran out, which depends on where the conversion ran (a worker, or a deeper
    stack in-process); such a result is not cached."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*_CONVERT_GC_THRESHOLDS)
    try:
        return _convert_one_file(job)
    finally:
        gc.set_threshold(*thresholds)


def _convert_one_file(job) -> tuple:
    result = _convert_as_written(job)
    if result[3] is not None and _TOO_DEEP in result[3]:
        held = _convert_holding_deep_statements(job)
        if held is not None:
            return held
    return result


#: how many statements too deeply nested for LibCST a file may have held back
_MAX_HELD = 8


@dataclass
class _Held:
    """A statement too deeply nested for LibCST (a 2,500-term expression that
    CPython compiles), held out of the conversion as a placeholder line."""

    name: str  # the placeholder's name (a line of its own in the held-back file)
    first: int  # its lines in the file, 1-based, inclusive
    last: int
    column: int  # (character column, 1-based)
    lines: List[bytes]  # as written


def _hold_deepest(data: bytes, held: List[_Held]) -> Optional[bytes]:
    """``data`` (already holding ``held`` back) with its most deeply nested simple
    statement replaced by a placeholder line -- or None where that cannot be done
    cleanly: a compound statement's header, a statement sharing a line."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    where = _deepest_statement_node(tree)
    if where is None or any(isinstance(getattr(where, f, None), list) for f in ("body", "orelse", "handlers")):
        return None
    lines = data.splitlines(keepends=True)
    first, last = where.lineno, where.end_lineno or where.lineno
    head, tail = lines[first - 1][: where.col_offset], lines[last - 1][where.end_col_offset or 0:]
    if head.strip() or tail.strip() and not tail.strip().startswith(b"#"):
        return None  # (another statement on its lines)
    name = f"__dp2ddp_held_{len(held)}__"
    newline = b"\r\n" if lines[last - 1].endswith(b"\r\n") else b"\n"
    text_lines = decode(data).splitlines()
    file_first = _file_line(held, first)  # (earlier holds shrank the text above)
    held.append(_Held(name, file_first, file_first + last - first,
                      character_column(text_lines, first, where.col_offset) if first <= len(text_lines) else 1,
                      lines[first - 1:last]))
    return b"".join(lines[: first - 1] + [head + name.encode() + newline] + lines[last:])


def _convert_holding_deep_statements(job) -> Optional[tuple]:
    """Convert the file with the statements too deeply nested for LibCST held back
    (a placeholder line each, put back as written afterwards), so that the rest of
    the file is converted: a held statement is reported -- left for a human when
    it holds words a transform acts on, a note otherwise.  None when they cannot
    be held back (then the file is left unchanged, as before)."""
    path, data, role, settings, skip = job
    held: List[_Held] = []
    current = data
    result = None
    for _ in range(_MAX_HELD):
        current = _hold_deepest(current, held)
        if current is None:
            return None
        result = _convert_as_written((path, current, role, settings, skip))
        if result[3] is None or _TOO_DEEP not in result[3]:
            break
    if result is None or result[3] is not None:
        return None
    _, output, findings, _, internal, lasting = result
    if output is not None and output != current:
        output = _put_back(output, held)
        if output is None:
            return None
    else:
        output = data
    from dp2ddp.codemods import TRANSFORMS

    words = [t for transform in TRANSFORMS for t in transform.TRIGGERS]

    def acted_on(text: str) -> bool:
        return any(w.search(text) if hasattr(w, "search") else w in text for w in words)

    for finding in findings:  # (lines of the held-back text -> the file's)
        finding.line = _file_line(held, finding.line)
    reports = []
    for h in sorted(held, key=lambda h: h.first):
        text = b"".join(h.lines).decode("utf-8", "replace")
        manual = acted_on(text)
        reports.append(Finding(
            "DDP900", "manual" if manual else "note", h.first, h.column,
            "too deeply nested for LibCST (CPython compiles it): this statement is kept as written and "
            + ("was not converted -- it uses what the conversion changes elsewhere: convert it by hand"
               if manual else "was not converted; nothing in it is what the conversion changes"),
            "", path,
        ))
    return path, output, sorted(reports + list(findings), key=lambda f: (f.line, f.column)), None, internal, lasting


def _file_line(held: List[_Held], line: int) -> int:
    """The line of the file as written of ``line`` of the text with ``held`` held
    back (each a placeholder line where its statement began)."""
    shift = 0
    for h in sorted(held, key=lambda h: h.first):
        placeholder = h.first - shift  # (its line in the held-back text)
        if placeholder >= line:
            break
        shift += h.last - h.first
    return line + shift


def _put_back(output: bytes, held: List[_Held]) -> Optional[bytes]:
    """The converted text with each placeholder line replaced by its statement as
    written (its first line at the placeholder's indentation; continuation lines
    as they were); None when a placeholder is not on one line of its own, once."""
    lines = output.splitlines(keepends=True)
    for h in held:
        where = [i for i, line in enumerate(lines) if line.strip() == h.name.encode()]
        if len(where) != 1:
            return None
        index = where[0]
        indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
        first = indent + h.lines[0].lstrip()
        lines[index: index + 1] = [first, *h.lines[1:]]
    return b"".join(lines)


def _convert_as_written(job) -> tuple:
    path, data, role, settings, skip = job
    try:
        module = _parse(path, data)
    except RecursionError:
        return path, None, [], _too_deep(path, data, "convert"), False, False
    except MemoryError as exc:
        error = syntax_error(path, exc).replace("cannot parse", "cannot analyse (LibCST)")
        return path, None, [], error, False, False
    except Exception as exc:  # CPython accepts it, LibCST cannot analyse it
        return path, None, [], syntax_error(path, exc).replace("cannot parse", "cannot analyse (LibCST)"), False, True
    try:
        from dp2ddp.codemods._oneliners import expand

        # (one-line forms the transforms act on spelled out: put back after, if unchanged)
        expanded, spelled = expand(module)
        new_module, findings = run_transforms(path, expanded, role, settings, skip, module.code)
        if not any(f.kind in ("change", "manual") for f in findings):
            # nothing converted and no marker to add (every change comes with a
            # finding): the file's own bytes, whatever LibCST's round trip makes of them
            return path, data, findings, None, False, True
        if module.bytes != data:
            return path, None, findings, _not_round_tripped(path, data, module.bytes), False, True
        output = _finish(expanded, new_module, spelled)
        return path, output, findings + _lost_comments(path, data, output, findings), None, False, True
    except InternalError as exc:
        return path, None, [], str(exc), True, False
    except RecursionError:
        return path, None, [], _too_deep(path, data, "convert"), False, False
    except Exception as exc:  # pragma: no cover - defensive
        return path, None, [], f"{path}: internal error: {exc!r}\n{traceback.format_exc()}", True, False


def _comments(data: bytes) -> List[Tuple[str, int, int]]:
    """(text, line, column) of every comment of a file, from its tokens."""
    import io
    import tokenize

    try:
        return [
            (t.string.rstrip(), t.start[0], t.start[1] + 1)
            for t in tokenize.tokenize(io.BytesIO(data).readline)
            if t.type == tokenize.COMMENT
        ]
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, LookupError):
        return []


def _lost_comments(path: str, data: bytes, output: bytes, findings: Sequence[Finding]) -> List[Finding]:
    """A note for each comment of the file that is not in the converted file (it
    was on code a transform replaced or dropped -- a removed GPU guard, a folded
    ``.cuda(  # ...``): nothing goes missing unsaid.  Reported by the change
    nearest to it; dp2ddp's own markers of an earlier run are not the user's."""
    from collections import Counter

    kept = Counter(text for text, _, _ in _comments(output))
    changes = [f for f in findings if f.kind == "change"]
    lost = []
    for text, line, column in _comments(data):
        if kept[text] > 0:
            kept[text] -= 1
            continue
        if text.startswith(MARKER) or not changes:
            continue
        near = min(changes, key=lambda f: abs(f.line - line))
        lost.append(
            Finding(
                near.code, "note", line, column,
                f"the comment {text[:60] + ('...' if len(text) > 60 else '')!r} was on code that "
                "was rewritten here and is not in the result: put it back by hand if it still applies",
                near.transform, path,
            )
        )
    return lost


def _finish(expanded: cst.Module, new_module: cst.Module, spelled) -> bytes:
    """The converted file: the statements the transforms wrote formatted, and the
    one-line forms ``expand`` spelled out put back where nothing changed them."""
    from dp2ddp.codemods._oneliners import restore
    from dp2ddp.formatting import format_changed

    new_module = format_changed(expanded, new_module)
    return restore(new_module.code, spelled).encode(new_module.encoding) if spelled else new_module.bytes


def _map(function, jobs: List, workers: int, each: Optional[Callable[[], None]] = None) -> List:
    """``map`` over a pool of forked processes (files are independent once the
    program's roles are known); in-process for one worker or one job.  ``each()``
    is called as each job is done."""
    results = []
    if workers <= 1 or len(jobs) <= 1 or not hasattr(os, "fork"):
        for job in jobs:
            results.append(function(job))
            if each is not None:
                each()
        return results
    from dp2ddp.workers import worker_pool

    with worker_pool(min(workers, len(jobs))) as pool:
        for result in pool.imap(function, jobs, chunksize=max(1, len(jobs) // (workers * 4))):
            results.append(result)
            if each is not None:
                each()
    return results


def convert_sources(
    sources: Mapping[str, bytes],
    settings: Settings = Settings(),
    verify: bool = True,
    explicit: Optional[Set[str]] = None,
    workers: int = 1,
    cache=None,
    post_check: bool = True,
    only: Optional[Set[str]] = None,
    context: Optional[Mapping[str, bytes]] = None,
    progress: Optional[PhaseProgress] = None,
) -> ConvertResult:
    """Convert a whole program given as {path: bytes}.

    ``explicit``: the files the user named (not found by walking a folder); None
    means all of them (see ``assign_roles``).  ``verify``: check that every output
    parses and is a fixed point (needed before writing).  ``workers``: processes
    for the per-file LibCST work.  ``cache``: a ``ConvertCache`` whose stored
    conversions stand in for converting a file again (the program's roles are
    always worked out afresh: they are part of each file's key).  ``post_check``:
    lint the outputs (``self_check``) and report what the conversion left undone.
    ``only``: convert just these files, each in the role the whole program gives
    it (what lint's JSON shows as DDP001's fix), without the checks of the whole.
    ``context``: modules of the program that were not given ({path: bytes}, e.g.
    the ``generate.py`` that ``dp2ddp convert train.py`` imports): read for their
    facts (what their functions do with the model handed to them), never converted.
    ``progress(phase, done, total)``: files converted ("converting"), then
    converted again to check the fixed point ("checking")."""
    results: Dict[str, FileResult] = {}
    facts: Dict[str, FileFacts] = {}
    untouchable: Set[str] = set()  # scripts that do not use torch: never changed
    candidates = []
    passthrough: Dict[str, FileFacts] = {}  # files without torch: links of the import graph
    for path, data in sources.items():
        result = FileResult(path=path, source=data)
        results[path] = result
        if may_matter(data):
            candidates.append((path, data))
        else:
            result.skipped = True
            if b"import" in data:
                passthrough[path] = import_facts(data.decode("utf-8", "replace"))
    for path, file_facts, error in _map_cached(
        _facts_one, candidates, workers, cache and cache.get_facts, cache and cache.put_facts, _PARALLEL_FACTS
    ):
        result = results[path]
        if error is not None:
            result.error = error
            continue
        if not file_facts.uses_torch and file_facts.has_main_guard:
            facts[path] = file_facts  # a possible entry point (never changed: see below)
            untouchable.add(path)
        if not file_facts.uses_torch:
            result.skipped = True
            passthrough[path] = file_facts
            # a project's own class named DataParallel: not converted, but said so
            result.findings = [
                Finding(
                    "DDP001", "note", line, col,
                    local_data_parallel_note(name),
                    "data-parallel-to-ddp", path,
                )
                for line, col, name in file_facts.local_data_parallel
                if not file_facts.torch_through_star  # (then it may well be torch's)
            ] + _star_findings(path, file_facts)
            continue
        facts[path] = file_facts
    for path, data in sorted((context or {}).items()):
        if path not in sources:
            _, file_facts, error, _ = _facts_one((path, data))
            if error is None:
                passthrough[path] = file_facts
    roles = assign_roles(facts, explicit, passthrough)
    jobs = []
    for path, role in roles.items():
        result = results[path]
        if path in untouchable:
            if role.is_entry and not facts[path].torch_through_star:  # (said so already)
                result.role = role
                result.findings.append(
                    Finding(
                        "DDP002", "manual", facts[path].main_guard_line, 1,
                        "entry point of the training program, but it does not use torch (dp2ddp "
                        "changes only files that do): start the process group here by hand -- "
                        "dist.init_process_group() first in this block, "
                        "dist.destroy_process_group() at its end",
                        "process-group-setup", path,
                    )
                )
            continue
        result.role = role
        if not (role.in_program or facts[path].mentions_data_parallel):
            result.skipped = True  # nothing in this file takes part in the conversion
            result.findings = _star_findings(path, facts[path])  # (or it cannot be told)
            script = facts[path].has_main_guard or facts[path].module_level_trains
            if facts[path].trains and script and not facts[path].already_distributed:
                # a training script whose data comes from outside the files given
                result.findings.append(
                    Finding(
                        "DDP002", "note", facts[path].main_guard_line or 1, 1,
                        "this script trains, but neither it nor the files it imports from here build "
                        "a DataLoader or use DataParallel, so it was not converted (its data may "
                        "come from a package outside these files); name it on the command line "
                        "to convert it as a single-GPU script, then shard its data by hand",
                        "process-group-setup", path,
                    )
                )
            continue
        if only is None or path in only:
            jobs.append((path, result.source, role, settings, _nothing_to_do(facts[path])))
    converting = functools.partial(progress, "converting") if progress is not None else None
    for path, output, findings, error, internal in _map_cached(
        _convert_one, jobs, workers, cache and cache.get, cache and cache.put, progress=converting
    ):
        result = results[path]
        result.output, result.findings, result.error, result.internal = output, findings, error, internal
        if facts[path].torch_through_star:
            # (a DataParallel the file cannot resolve may well be torch's)
            result.findings = [f for f in findings if not is_local_data_parallel_note(f)] + _star_findings(
                path, facts[path]
            )
    if only is not None:
        return ConvertResult(files=[results[p] for p in sorted(only) if p in results])
    _unsharded_data_note(results, facts, roles)
    if verify:
        _verify(results, settings, explicit, workers, cache, progress)
    _withhold_half_programs(results, roles, {**passthrough, **facts})
    if post_check:
        _report_what_lint_still_finds(results)
    return ConvertResult(files=list(results.values()))


def _report_what_lint_still_finds(results: Dict[str, FileResult]) -> None:
    from dp2ddp import self_check

    converted = {
        path: (r.source, r.output, r.findings)
        for path, r in results.items()
        if r.changed and r.error is None and r.output is not None
    }
    checked = self_check.check(converted)
    for path, missed in checked.missed.items():
        results[path].findings.extend(missed)
    for path, still in checked.still_linted.items():
        results[path].still_linted = still


def _program(entry: str, graph: Mapping[str, Set[str]]) -> Set[str]:
    """The entry point and every file it imports, transitively."""
    seen, todo = {entry}, [entry]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _withhold_half_programs(
    results: Dict[str, FileResult], roles: Mapping[str, FileRole], linked: Mapping[str, FileFacts]
) -> None:
    """An entry point that could not be converted leaves its modules as they were:
    converted on their own (a DistributedSampler, guards on the rank) they would
    need the process group the entry no longer sets up, and the program would fail
    even under plain ``python``.  Another entry point that imports one of those
    modules is then left as it was too (converted without its loader's sampler it
    would train every rank on all the data), and so on."""
    failed = [p for p, role in roles.items() if role.is_entry and results[p].error is not None]
    if not failed:
        return
    graph = _resolve_imports(list(linked), linked)
    entries = [p for p, role in roles.items() if role.is_entry]
    programs = {entry: _program(entry, graph) for entry in entries}
    withheld: Dict[str, str] = {}  # path -> the entry point that could not be converted
    todo = list(failed)
    while todo:
        entry = todo.pop()
        for path in sorted(programs[entry] - {entry}):
            if path in withheld:
                continue
            withheld[path] = entry
            for other in entries:  # another program that shares the module
                if other not in withheld and other not in failed and path in programs[other]:
                    withheld[other] = entry
                    todo.append(other)
    for path, entry in sorted(withheld.items()):
        result = results.get(path)
        if result is not None and result.changed:
            result.output = None
            result.error = (
                f"{path}:1:1: not converted: the entry point {entry}, which shares this program, could "
                "not be converted (see its error), and this file converted without it would leave the "
                "program half-converted; left unchanged"
            )


def _star_findings(path: str, file_facts: FileFacts) -> List[Finding]:
    """Torch's usual names that reach the file only through ``from X import *``:
    the transforms resolve names through explicit imports and leave those alone."""
    data_parallel = bool(file_facts.mentions_data_parallel or file_facts.local_data_parallel)
    return [
        Finding(
            "DDP001" if data_parallel else "DDP002", "manual", line, 1,
            f"torch's names in this file (torch, nn, DataLoader...) come through `from {module} "
            "import *`, which dp2ddp's name resolution cannot follow, so what uses them is not "
            "converted: import them explicitly (import torch, import torch.nn as nn, ...), then "
            "convert again",
            "data-parallel-to-ddp" if data_parallel else "process-group-setup",
            path,
        )
        for line, module in file_facts.torch_through_star
    ]


def _unsharded_data_note(results: Dict[str, FileResult], facts: Mapping[str, FileFacts], roles) -> None:
    """A note at the entry point when nothing shards the training data: the
    program has no DataLoader (batches cut from a tensor by hand, pytorch/examples'
    word_language_model), or every loader was taken for evaluation and the
    training batches come from elsewhere (a dataset's own ``get_batch()``)."""
    program = [p for p, role in roles.items() if role.in_program]
    if any(facts[p].torch_through_star for p in program):
        return  # not analysed: said so already
    if not any(facts[p].has_data_loader for p in program):
        message = (
            "no DataLoader in this program: every rank trains on the same batches; "
            "give each rank its part of the data (e.g. data[rank::world_size])"
        )
    elif not any(
        f.code == "DDP101" and f.kind in ("change", "manual") for p in program for f in results[p].findings
    ) and not any(b"DistributedSampler" in results[p].source for p in program) and any(
        facts[p].trains for p in program
    ):
        message = (
            "no DataLoader here feeds training (the ones found evaluate, and stay unsharded): "
            "if the training batches come from elsewhere (a dataset's own get_batch(), a "
            "tensor), every rank trains on the same data; give each rank its part "
            "(a DistributedSampler, or data[rank::world_size])"
        )
    else:
        return
    for path, role in roles.items():
        if role.is_entry and not role.already_distributed and results[path].error is None:
            results[path].findings.append(Finding("DDP101", "note", 1, 1, message, "distributed-sampler", path))


def _facts_one(item) -> tuple:
    """(path, facts, error, lasting) of one file from its ``ast`` (runs in a worker
    process with -j); ``lasting`` as in ``_convert_one``."""
    path, data = item
    try:
        text = decode(data)
        tree = ast.parse(data, filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError, LookupError) as exc:
        return path, None, syntax_error(path, exc), True
    except (RecursionError, MemoryError):
        return path, None, f"{path}:1:1: cannot parse: nested too deeply", False
    return path, collect_facts(Source(path, text, tree)), None, True


#: files below which the ``ast`` facts are not worth a process pool
_PARALLEL_FACTS = 200


def _map_cached(
    function, items: List, workers: int, get=None, put=None, min_parallel: int = 0, progress: Optional[Progress] = None
) -> List[tuple]:
    """``function(item)`` for every item, in order, less its last field
    (``lasting``): from ``get(item)`` where a cache has it (None: not there),
    else computed in the pool (``_map``, from ``min_parallel`` items on) and kept
    with ``put(item, result)`` when ``lasting`` says it follows from the item
    alone (not a bug in dp2ddp, not a stack that ran out).  ``progress(done,
    total)`` as items are done (the cached ones first)."""
    results = [get(item) if get is not None else None for item in items]
    todo = [item for item, hit in zip(items, results) if hit is None]
    each = None
    if progress is not None:
        done = [len(items) - len(todo)]
        progress(done[0], len(items))

        def each() -> None:
            done[0] += 1
            progress(done[0], len(items))

    computed = iter(_map(function, todo, workers if len(todo) >= min_parallel else 1, each))
    for index, hit in enumerate(results):
        if hit is None:
            *result, lasting = next(computed)
            if lasting and put is not None:
                put(items[index], tuple(result))
            results[index] = tuple(result)
    return results


def _verify(
    results: Dict[str, FileResult], settings: Settings, explicit=None, workers: int = 1, cache=None,
    progress: Optional[PhaseProgress] = None,
) -> None:
    """Every output parses, and converting the outputs again changes nothing."""
    outputs = {}
    for path, result in results.items():
        if result.output is None or not result.changed:
            outputs[path] = result.source
            continue
        try:
            _parse(path, result.output)
            _check_compiles(path, result.output)
        except Exception as exc:
            result.error = f"{path}: internal error: the converted code does not parse ({exc})"
            result.internal, result.output = True, None
            outputs[path] = result.source
            continue
        outputs[path] = result.output
    if not any(r.changed for r in results.values()):
        return
    checking = (lambda phase, done, total: progress("checking", done, total)) if progress is not None else None
    again = convert_sources(
        outputs, settings, verify=False, explicit=explicit, workers=workers, cache=cache, post_check=False,
        progress=checking,
    )
    for second in again.files:
        first = results[second.path]
        if first.changed and (second.changed or second.error):
            detail = "".join(
                difflib.unified_diff(
                    first.output.decode("utf-8", "replace").splitlines(True),
                    (second.output or b"").decode("utf-8", "replace").splitlines(True),
                    "first pass",
                    "second pass",
                )
            )
            first.error = (
                f"{first.path}: internal error: converting the result again changes it "
                f"(not idempotent); the file is left as it was\n{detail or second.error}"
            )
            first.internal, first.output = True, None


# ------------------------------------------------------------------ targeted fixes
def apply_transforms(
    path: str, source: bytes, names, settings: Settings = Settings(markers=False)
) -> FileResult:
    """Run the named transforms on one file, whatever its role in a conversion.

    Used by ``lint --fix`` on scripts that are already distributed: the file is
    treated as program code (not a pre-DDP script), and the result is checked to
    parse and to be a fixed point like every conversion.  No ``# dp2ddp:``
    markers: lint reports the spots a transform leaves; a comment is no fix.
    """
    import libcst as cst
    from libcst.codemod import CodemodContext

    from dp2ddp.codemods import TRANSFORMS
    from dp2ddp.codemods._base import apply_scheduled_imports

    result = FileResult(path=path, source=source)
    try:
        module = _parse(path, source)
        _check_compiles(path, source)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's
        result.error = syntax_error(path, exc)
        return result
    if module.bytes != source:
        result.error = _not_round_tripped(path, source, module.bytes)
        return result
    facts = collect_facts(Source(path, decode(source)))
    role = FileRole(
        is_entry=facts.module_level_trains or facts.has_main_guard and facts.trains,
        entry_kind="module" if facts.module_level_trains else "main-block",
        in_program=True,
        single_device="module-access" in names,
        already_distributed=False,
        group_always_up=False,  # the script starts it itself: maybe late, maybe not at all
    )
    selected = tuple(t for t in TRANSFORMS if t.NAME in names and t.NAME != "process-group-setup")

    def run(module: cst.Module, original_code: str):
        findings = []
        to_file, start_code = LineMap(original_code, module.code), module.code
        context = CodemodContext(filename=path)
        for transform_cls in selected:
            transform = transform_cls(context, settings, role)
            try:
                new_module = transform.transform_module(module, apply_imports=False)
            except RecursionError:
                raise
            except Exception as exc:
                raise InternalError(f"{path}: transform {transform_cls.NAME} crashed: {exc!r}") from exc
            _to_file(transform.findings, to_file, start_code, module.code)
            findings.extend(transform.findings)
            if any(f.kind in ("change", "manual") for f in transform.findings):
                module = new_module
        return apply_scheduled_imports(context, module), findings

    from dp2ddp.codemods._oneliners import expand

    def run_expanded(module: cst.Module):
        expanded, spelled = expand(module)
        new_module, findings = run(expanded, module.code)
        return _finish(expanded, new_module, spelled), findings

    try:
        output, findings = run_expanded(module)
        if output != source:
            again, _ = run_expanded(_parse(path, output))
            _check_compiles(path, output)
            if again != output:
                raise InternalError(f"{path}: internal error: the fix is not idempotent")
    except InternalError as exc:
        result.error, result.internal = str(exc), True
        return result
    except RecursionError:
        result.error = _too_deep(path, source, "fix")
        return result
    result.output, result.findings, result.role = output, findings, role
    return result
