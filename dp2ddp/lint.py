"""The lint engine: pure functions from sources to diagnostics (and fixed sources).

Per file:

1. decode (PEP 263 cookie, BOM); a file that is not text is one DDP900 finding;
2. prefilter: the selected rules' ``TRIGGERS`` -- a file that contains none of
   them cannot produce a finding and is never parsed;
3. ``ast.parse`` (a syntax error is one DDP900 finding at its line);
4. run the selected rules; drop what ``# noqa`` and per-file ignores suppress;
   report ``# noqa`` comments that suppress nothing (DDP901).

Fixes are the convert transforms (LibCST), built only for files with fixable
findings: DDP001's fix is the whole conversion of the program (so ``lint --fix``
gives the same code as ``convert --write``); the others run their transforms
on their file.

Nothing here imports LibCST, black or torch until a fix is asked for.
"""

from __future__ import annotations

import ast
import gc
import io
import os
import re
import tokenize
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import PurePath
from typing import Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from dp2ddp.codemods._analysis import Source, decode, decode_position, is_test_module
from dp2ddp.codemods.rules import BY_CODE, RULES, Diagnostic, Rule
from dp2ddp.cache import LintCache
from dp2ddp.config import LintConfig, matches
from dp2ddp.files import SourceFiles

SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z0-9_]+(?:[\s,]+[A-Za-z0-9_]+)*))?", re.IGNORECASE)
_OUR_CODE = re.compile(r"^DDP\d+$")


@dataclass
class LintResult:
    diagnostics: List[Diagnostic] = field(default_factory=list)
    files: int = 0
    parsed: int = 0
    #: "path: cannot read: why" for files that could not be read when linted
    unreadable: List[str] = field(default_factory=list)
    #: "path: rule CODE crashed: why" -- a bug in dp2ddp (exit 123); the other
    #: rules' findings on that file, and every other file's, are still reported
    crashes: List[str] = field(default_factory=list)


class FileLint(NamedTuple):
    """What linting one file gave: its findings, whether it was parsed, and the
    rules that crashed on it (one "path: rule CODE crashed: ..." line each)."""

    findings: List[Diagnostic]
    parsed: bool
    crashes: List[str]
    #: the module files read for the file's imports (``codemods._program``)
    imported_files: Tuple[str, ...] = ()


def selected_rules(config: LintConfig) -> List[Rule]:
    """As ruff decides: the most specific selector that matches a code wins
    (``--select DDP302 --ignore DDP3`` keeps DDP302); on a tie, ignore wins.
    With no ``select``, the default set: the rules whose ``DEFAULT`` is true;
    ``extend_select`` adds to either."""
    rules = []
    for rule_cls in RULES:
        if config.select:
            chosen = _specificity(rule_cls.CODE, config.select)
        else:  # the default set; a rule off by default runs only when a selector names it
            chosen = 0 if rule_cls.DEFAULT else -1
        chosen = max(chosen, _specificity(rule_cls.CODE, config.extend_select))
        if chosen >= 0 and chosen > _specificity(rule_cls.CODE, config.ignore):
            rules.append(rule_cls())
    return rules


def _specificity(code: str, selectors: Sequence[str]) -> int:
    """Length of the longest selector matching ``code`` (``ALL``: 0), -1 if none."""
    return max((0 if s == "ALL" else len(s) for s in selectors if matches(code, [s])), default=-1)


def lint_source(
    path: str,
    data: bytes,
    rules: Sequence[Rule],
    config: LintConfig = LintConfig(),
    use_trigger: bool = True,
) -> FileLint:
    """Diagnostics of one file, whether it had to be parsed, and the rules that
    crashed on it: a rule's bug costs that rule's findings on that file only."""
    if path.endswith(".ipynb"):
        return _lint_notebook(path, data, rules, config, use_trigger)
    codes = {r.CODE for r in rules}
    try:
        text = decode(data)
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        if use_trigger and not _may_matter(data):
            return FileLint([], False, [])  # (random bytes: out of scope, as for convert)
        line, column = decode_position(exc) if isinstance(exc, UnicodeDecodeError) else (1, 1)
        return FileLint(_syntax(path, line, column, f"cannot decode the file: {exc}", codes), False, [])
    if "\x00" in text:
        if use_trigger and not _may_matter(data):
            return FileLint([], False, [])
        return FileLint(_syntax(path, 1, 1, "not a Python source file (NUL bytes)", codes), False, [])
    candidates = [r for r in rules if r.CODE not in ("DDP900", "DDP901")]
    wants_noqa = "DDP901" in codes and "noqa" in text and "DDP" in text
    if use_trigger:
        # every rule is about torch code: a file that never mentions torch is out of
        # scope; and a rule runs only where its trigger words occur.  A torch file
        # is still parsed when no rule can fire: its syntax errors are reported (DDP900)
        mentions_torch = "torch" in text
        candidates = [r for r in candidates if r.can_fire(text)] if mentions_torch else []
        if not candidates and not wants_noqa and not (mentions_torch and "DDP900" in codes):
            return FileLint([], False, [])
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 1
        col = exc.offset or 1
        return FileLint(_syntax(path, line, col, f"cannot parse: {exc.msg}", codes), True, [])
    except (ValueError, RecursionError, MemoryError) as exc:
        return FileLint(_syntax(path, 1, 1, f"cannot parse: {exc}", codes), True, [])
    src = Source(path, text, tree)
    found: List[Diagnostic] = []
    seen: Set[Tuple] = set()
    crashes: List[str] = []
    if any(not r.IN_TESTS for r in candidates) and is_test_module(src):
        candidates = [r for r in candidates if r.IN_TESTS]
    for rule in candidates:
        try:
            # all of a rule's findings or none: a crash halfway must not leave a part
            # that looks like the whole
            mine = list(rule.check(src))
        except Exception as exc:  # a bug in a rule, not in the user's code
            import traceback

            crashes.append(f"{path}: rule {rule.CODE} crashed: {exc!r}\n{traceback.format_exc()}")
            continue
        for diagnostic in mine:
            key = (diagnostic.code, diagnostic.line, diagnostic.column)
            if key not in seen:
                seen.add(key)
                found.append(diagnostic)
    found = [d for d in found if not _file_ignored(path, d.code, config)]
    if "noqa" in text:
        ran = {c for c in codes if not _file_ignored(path, c, config)}
        found = _apply_noqa(src, found, report_unused="DDP901" in ran, ran=ran)
    imported = src.cache.get("imported_files", ())
    return FileLint(sorted(found, key=lambda d: d.sort_key), True, crashes, imported)  # type: ignore[arg-type]


def _lint_notebook(path: str, data: bytes, rules: Sequence[Rule], config: LintConfig, use_trigger: bool) -> FileLint:
    """A Jupyter notebook's code cells, linted as one program in cell order (a
    name bound in one cell is used in the next), each line's IPython magic
    (``%time``, ``!pip``) blanked out.  A finding names its cell and is placed at
    the line and column in that cell; notebooks are not fixed (``fix`` is null),
    and the notebook's JSON is never written."""
    import json

    codes = {r.CODE for r in rules}
    try:
        cells = json.loads(data.decode("utf-8")).get("cells", [])
    except (UnicodeDecodeError, ValueError, AttributeError) as exc:
        return FileLint(_syntax(path, 1, 1, f"not a readable notebook: {exc}", codes), False, [])
    lines: List[str] = []
    origin: List[Tuple[int, int]] = []  # (cell number, line in it) of each line of the program
    number = 0
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        number += 1
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        for at, line in enumerate(text.splitlines(), 1):
            magic = line.lstrip().startswith(("%", "!", "?")) or line.rstrip().endswith("?")
            lines.append("" if magic else line)
            origin.append((number, at))
        lines.append("")  # (a cell ends its last statement)
        origin.append((number, len(text.splitlines()) + 1))
    program = "\n".join(lines) + "\n"
    found, parsed, crashes, imported = lint_source(path + ".py", program.encode("utf-8"), rules, config, use_trigger)
    placed = []
    for diagnostic in found:
        cell, line = origin[min(diagnostic.line, len(origin)) - 1] if origin else (1, 1)
        end_cell, end_line = origin[min(diagnostic.end_line, len(origin)) - 1] if origin else (1, 1)
        placed.append(
            Diagnostic(
                path=path, line=line, column=diagnostic.column,
                end_line=end_line if end_cell == cell else line, end_column=diagnostic.end_column,
                code=diagnostic.code, name=diagnostic.name, severity=diagnostic.severity,
                message=f"cell {cell}: {diagnostic.message}", fix=None,
            )
        )
    crashes = [c.replace(path + ".py", path) for c in crashes]
    return FileLint(placed, parsed, crashes, imported)


def _syntax(path: str, line: int, col: int, message: str, codes: Set[str]) -> List[Diagnostic]:
    if "DDP900" not in codes:
        return []
    rule = BY_CODE["DDP900"]
    return [
        Diagnostic(path, line, col, line, col, rule.CODE, rule.NAME, rule.SEVERITY, message)
    ]


def _file_ignored(path: str, code: str, config: LintConfig) -> bool:
    if not config.per_file_ignores:
        return False
    rel = _relative(path, config)
    for pattern, codes in config.per_file_ignores:
        if (fnmatch(rel, pattern) or fnmatch(PurePath(rel).name, pattern)) and matches(code, codes):
            return True
    return False


def _relative(path: str, config: LintConfig) -> str:
    from pathlib import Path

    if config.root is None:
        return PurePath(path).as_posix()
    try:
        return Path(path).resolve().relative_to(config.root.resolve()).as_posix()
    except ValueError:
        return PurePath(path).as_posix()


def _noqa_comments(src: Source) -> Dict[int, Tuple[Optional[Set[str]], int]]:
    """line -> (codes or None for a bare noqa, column), from real comments only."""
    comments: Dict[int, Tuple[Optional[Set[str]], int]] = {}
    try:
        tokens = tokenize.generate_tokens(io.StringIO(src.text).readline)
        for token in tokens:
            if token.type != tokenize.COMMENT:
                continue
            match = _NOQA.search(token.string)
            if match is None:
                continue
            codes = match.group("codes")
            parsed = {c.upper() for c in re.split(r"[\s,]+", codes) if c} if codes else None
            comments[token.start[0]] = (parsed, token.start[1] + match.start() + 1)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return comments


def _apply_noqa(
    src: Source, found: List[Diagnostic], report_unused: bool, ran: Optional[Set[str]] = None
) -> List[Diagnostic]:
    """Drop the findings a ``# noqa`` suppresses; with ``report_unused``, report
    the DDP codes of a noqa that suppress nothing -- among the rules that ran
    (``ran``): a noqa for a rule that was not selected is not known to be unused."""
    # cheap first look: is a noqa on a line with a finding, or naming a DDP code?
    lines = {d.line for d in found}
    relevant = any(
        "noqa" in text and (number in lines or "DDP" in text)
        for number, text in enumerate(src.lines, 1)
    )
    if not relevant:
        return found
    comments = _noqa_comments(src)
    if not comments:
        return found
    used: Dict[int, Set[str]] = {}
    kept = []
    for diagnostic in found:
        entry = comments.get(diagnostic.line)
        if entry is not None and (entry[0] is None or diagnostic.code in entry[0]):
            used.setdefault(diagnostic.line, set()).add(diagnostic.code)
            continue
        kept.append(diagnostic)
    if report_unused:
        rule = BY_CODE["DDP901"]
        for line, (codes, column) in sorted(comments.items()):
            if codes is None:
                continue  # a bare noqa may be meant for another tool
            unknown = {c for c in codes if _OUR_CODE.match(c) and c not in BY_CODE}
            unused = {c for c in codes if _OUR_CODE.match(c) and (ran is None or c in ran)} - used.get(line, set())
            for found, message in (
                (unknown, "noqa: {}: no such rule (see `dp2ddp rule --all`)"),
                (unused, "unused noqa: {}: nothing is suppressed here"),
            ):
                if found:
                    kept.append(
                        Diagnostic(
                            src.path, line, column, line, column, rule.CODE, rule.NAME, rule.SEVERITY,
                            message.format(", ".join(sorted(found))),
                        )
                    )
    return kept


_WORKER_CONFIG: Optional[LintConfig] = None
_WORKER_RULES: Optional[List[Rule]] = None


def _may_matter(data: bytes) -> bool:
    """convert's prefilter (``engine.may_matter``): a file that does not decode is
    reported by both, or by neither -- one verdict."""
    from dp2ddp.engine import may_matter

    return may_matter(data)


def _init_worker(config: LintConfig) -> None:
    global _WORKER_CONFIG, _WORKER_RULES
    _WORKER_CONFIG, _WORKER_RULES = config, selected_rules(config)


def _lint_job(job: Tuple[str, bytes, bool]) -> Tuple[str, FileLint]:
    path, data, use_trigger = job
    assert _WORKER_RULES is not None and _WORKER_CONFIG is not None
    return path, lint_source(path, data, _WORKER_RULES, _WORKER_CONFIG, use_trigger)


def _lint_chunk(jobs: List[Tuple[str, bytes, bool]]) -> List[Tuple[str, FileLint]]:
    return [_lint_job(job) for job in jobs]


def _run_jobs(todo: Iterable, count: int, config: LintConfig, rules: List[Rule], workers: int):
    """(path, FileLint) for each of the ``count`` jobs, in order: in a
    pool of forked processes when there are enough files to pay for it, in this
    process otherwise.  ``todo`` is consumed lazily, a few chunks ahead of the
    workers (``Executor.map`` would read every file first): the workers start on
    the first files while the rest are still unread, and only the chunks in
    flight are in memory."""
    if workers > 1 and count >= 64 and hasattr(os, "fork"):
        import itertools
        from collections import deque

        from dp2ddp.workers import worker_pool

        size = max(1, min(32, count // (workers * 8)))
        jobs = iter(todo)
        chunks = iter(lambda: list(itertools.islice(jobs, size)), [])
        with worker_pool(workers, initializer=_init_worker, initargs=(config,)) as pool:
            flight = deque(pool.submit(_lint_chunk, chunk) for chunk in itertools.islice(chunks, 2 * workers))
            while flight:
                done = pool.result(flight.popleft())
                for chunk in itertools.islice(chunks, 1):
                    flight.append(pool.submit(_lint_chunk, chunk))
                yield from done
    else:
        for path, data, use_trigger in todo:
            yield path, lint_source(path, data, rules, config, use_trigger)


@contextmanager
def _rare_gc():
    """The ast trees of a lint run die by reference counting, file by file: the
    cyclic collector, run every 700 allocations by default, only re-walks live
    objects (a sixth of lint's time).  Run it a hundredth as often while linting
    -- only then: LibCST's trees (convert, fixes) do form cycles."""
    before = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def lint_sources(
    sources: Mapping[str, bytes],
    config: LintConfig = LintConfig(),
    use_trigger: bool = True,
    workers: int = 1,
    cache: Optional["LintCache"] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    release: bool = False,
) -> LintResult:
    """Lint {path: bytes}.  ``workers`` > 1 parses in a pool of forked processes
    (only worth it for many files); ``cache`` skips files whose content it has
    seen with the same configuration.  The result is the same either way.
    ``release``: drop the bytes of files without findings once they are linted
    (``sources`` is a ``SourceFiles``; nothing will fix them)."""
    with _rare_gc():
        result = _lint_sources(sources, config, use_trigger, workers, cache, progress, release)
    result.diagnostics.sort(key=lambda d: d.sort_key)
    return result


def _lint_sources(sources, config, use_trigger, workers, cache, progress, release) -> LintResult:
    rules = selected_rules(config)
    result = LintResult()
    pending: List[str] = []
    for path in list(sources):
        try:
            cached = cache.get(path, sources) if cache is not None else None
        except OSError:  # gone or unreadable since it was found: reported below
            cached = None
        if cached is not None:
            result.files += 1
            result.diagnostics.extend(cached)
            if release and not cached:
                sources.release(path)  # type: ignore[attr-defined]
            continue
        pending.append(path)

    def read():
        for path in pending:
            try:
                data = sources[path]
            except OSError as exc:
                result.unreadable.append(f"{path}: cannot read: {exc.strerror or exc}")
                if isinstance(sources, SourceFiles):
                    sources.discard(path)  # nothing later (a fix, a report) reads it again
                continue
            yield path, data, use_trigger

    todo = read()
    for done, (path, (found, parsed, crashes, imported)) in enumerate(
        _run_jobs(todo, len(pending), config, rules, workers), 1
    ):
        if progress:
            progress(done, len(pending))
        result.files += 1
        result.parsed += int(parsed)
        result.diagnostics.extend(found)
        result.crashes.extend(crashes)
        if cache is not None and not crashes:  # (a crash is reported again on the next run)
            cache.put(path, sources, found, imported)
        if release and not found:
            sources.release(path)  # type: ignore[attr-defined]
    return result


def failing(diagnostics: Iterable[Diagnostic], fail_on: str) -> List[Diagnostic]:
    threshold = SEVERITY_RANK[fail_on]
    return [d for d in diagnostics if SEVERITY_RANK[d.severity] >= threshold]


# ------------------------------------------------------------------ fixes
def fixable(diagnostic: Diagnostic, unsafe: bool) -> bool:
    """The rule has a fix (safe, or unsafe when allowed) and it was not found not
    to apply here (``fix`` dropped after computing it or after --fix left it)."""
    rule = BY_CODE.get(diagnostic.code)
    if rule is None or rule.FIX is None or diagnostic.fix is None:
        return False
    return rule.FIX == "safe" or unsafe


def fix_sources(
    sources: Mapping[str, bytes], diagnostics: Sequence[Diagnostic], unsafe: bool, explicit=None
) -> Dict[str, "object"]:
    """Fixed bytes for the files whose findings can be fixed: {path: FileResult}."""
    from dp2ddp.engine import apply_transforms, convert_sources

    wanted: Dict[str, Set[str]] = {}
    for diagnostic in diagnostics:
        if fixable(diagnostic, unsafe):
            wanted.setdefault(diagnostic.path, set()).update(BY_CODE[diagnostic.code].FIX_TRANSFORMS)
    results: Dict[str, object] = {}
    if any("*" in names for names in wanted.values()):
        # DDP001: the fix is the conversion of the whole program
        converted = convert_sources(dict(sources), explicit=explicit)
        for file in converted.files:
            if file.changed or file.error:
                results[file.path] = file
    for path, names in wanted.items():
        names = names - {"*"}  # (a file the conversion left as it was: its other fixes still apply)
        if path in results or not names:
            continue
        results[path] = apply_transforms(path, sources[path], names)
    for path, file in list(results.items()):
        results[path] = _respect_noqa(file)
    return results


def _respect_noqa(file):
    """The fix without the changes a ``# noqa`` suppresses: a hunk that touches a
    line whose noqa names one of the hunk's codes (or is bare) is left out -- and
    the whole file is left unfixed when what remains would be inconsistent (the
    review's test: a sampler without its process group, a name only a rejected
    change defines)."""
    import dataclasses

    from dp2ddp import review

    if file.error is not None or not file.changed or b"noqa" not in file.source:
        return file
    comments = _noqa_comments(Source(file.path, decode(file.source)))
    if not comments:
        return file
    hunks = review.hunks_of(file)
    # a noqa suppresses the findings on its own line (as in lint): it holds a
    # change made for such a finding, not one that only passes by its line
    # (a save line whose noqa names DDP304, inside the block that a DDP304 fix
    # on the line above and the save's own guard rewrite together)
    found_on = {(f.code, f.line) for f in file.findings if f.kind != "note"}
    held = False
    for hunk in hunks:
        touched = range(hunk.start + 1, max(hunk.end, hunk.start + 1) + 1)
        hunk.accepted = not any(
            line in comments
            and (comments[line][0] is None or any((code, line) in found_on for code in comments[line][0] & hunk.codes))
            for line in touched
        )
        held |= not hunk.accepted
    if not held:
        return file
    if review.check_selection({file.path: (file, hunks)}) or not any(h.accepted for h in hunks):
        # (then nothing of the fix applies: not counted as fixed, the findings lose their [*])
        return dataclasses.replace(file, output=file.source)
    return dataclasses.replace(file, output=review.encode_selection(file, hunks))


def fix_edits(sources: Mapping[str, bytes], diagnostics: Sequence[Diagnostic]) -> None:
    """Fill each fixable diagnostic's ``fix["edits"]`` with the replacement its fix
    makes: ``[{"line", "end_line", "content"}]`` -- replace lines ``line`` up to
    ``end_line`` (exclusive) of the original with ``content``.  The edits are the
    rule's whole fix in the file, the same for each of its findings there (apply
    them once)."""
    from dp2ddp import linediff
    from dp2ddp.engine import apply_transforms, convert_sources

    by_key: Dict[Tuple[str, str], List[Diagnostic]] = {}
    for d in diagnostics:
        if d.fix is not None:
            by_key.setdefault((d.path, d.code), []).append(d)
    whole = None
    for (path, code), group in by_key.items():
        names = BY_CODE[code].FIX_TRANSFORMS
        if "*" in names:
            if whole is None:
                # each file in the role the whole program gives it, but only the
                # files with such a finding converted (not the repository)
                program_wide = {p for (p, c) in by_key if "*" in BY_CODE[c].FIX_TRANSFORMS}
                converted = convert_sources(dict(sources), verify=False, post_check=False, only=program_wide)
                whole = {f.path: f for f in converted.files}
            fixed = whole.get(path)
        else:
            fixed = apply_transforms(path, sources[path], set(names))
        if fixed is None or fixed.output is None or not fixed.changed:
            for d in group:
                d.fix = None  # the fix does not apply here: say so, no empty promise
            continue
        before = decode(sources[path]).splitlines(keepends=True)
        after = decode(fixed.output).splitlines(keepends=True)
        hunks = []
        for tag, i1, i2, j1, j2 in linediff.opcodes(before, after):
            if tag != "equal":
                hunks.append({"line": i1 + 1, "end_line": i2 + 1, "content": "".join(after[j1:j2])})
        for d in group:
            # the whole fix: the rule's fix in this file is one rewrite (an import at the
            # top and the guard at the spot; for DDP001 the file's whole conversion), and
            # a part of it alone may not run -- every finding of the group carries it
            d.fix["edits"] = hunks


def drop_failed_fixes(before: Sequence[Diagnostic], after: Sequence[Diagnostic], unsafe: bool) -> None:
    """After --fix: a finding whose fix was tried on its file and that is still
    there cannot be fixed automatically -- it loses its fix marker."""
    tried = {(d.path, d.code) for d in before if fixable(d, unsafe)}
    for d in after:
        if (d.path, d.code) in tried:
            d.fix = None
