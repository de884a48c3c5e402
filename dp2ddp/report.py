"""What a convert run tells the user: the diff, the summary, the exit code."""

from __future__ import annotations

import difflib
from typing import List, Optional, Sequence

import click

from dp2ddp import launch
from dp2ddp.engine import ConvertResult, FileResult, LineMap
from dp2ddp.self_check import TRANSFORM as FOUND_IN_THE_RESULT
from dp2ddp.self_check import incomplete

EXIT_OK, EXIT_FINDINGS, EXIT_INTERNAL = 0, 1, 123


def _text(data: bytes) -> str:
    for encoding in ("utf-8-sig", "latin-1"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace")


def diff(file: FileResult, color: bool = False) -> str:
    """Unified diff of one converted file (``a/``/``b/`` headers, like git)."""
    before = _text(file.source).splitlines(keepends=True)
    after = _text(file.output or b"").splitlines(keepends=True)
    # a name with a space ends with a tab, as git writes it: GNU patch reads a
    # header's name up to the first tab, and to the first space without one
    tab = "\t" if " " in file.path else ""
    lines = list(difflib.unified_diff(before, after, f"a/{file.path}{tab}", f"b/{file.path}{tab}"))
    fixed = []
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        fixed.append(line)
    if not color:
        return "".join(fixed)
    out = []
    for line in fixed:
        # styled without the line break: the reset code ends the line, not starts the next
        body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        if line.startswith(("+++", "---")):
            out.append(click.style(body, bold=True) + end)
        elif line.startswith("@@"):
            out.append(click.style(body, fg="cyan") + end)
        elif line.startswith("+"):
            out.append(click.style(body, fg="green") + end)
        elif line.startswith("-"):
            out.append(click.style(body, fg="red") + end)
        else:
            out.append(line)
    return "".join(out)


def would_change(result: ConvertResult) -> List[str]:
    """``would convert PATH`` for each file ``--check`` finds would change (as
    black's ``would reformat``): said under ``-q`` too."""
    return [f"would convert {file.path}" for file in sorted(result.changed, key=lambda f: f.path)]


def summary(
    result: ConvertResult,
    mode: Optional[str],
    written: Sequence[FileResult] = (),
    nproc: str = "gpu",
) -> List[str]:
    lines: List[str] = []
    for file in result.files:
        if file.error is not None:
            prefix = "internal error" if file.internal else "error"
            lines.append(f"{prefix}: {file.error}")
    if mode == "check":
        lines += would_change(result)
    manual = [f for file in result.files for f in file.findings if f.kind == "manual"]
    notes = [f for file in result.files for f in file.findings if f.kind == "note"]
    # a file written now: its findings at their lines in the new file (the old one is gone)
    moved = {f.path: LineMap(_text(f.output), _text(f.source)) for f in written if f.output is not None}
    marked = _marked_lines(written, manual)

    def place(f) -> str:
        if id(f) in marked:
            line, column = marked[id(f)]
        else:
            line, column = moved[f.path].position(f.line, f.column) if f.path in moved else (f.line, f.column)
        return f"{f.path}:{line}:{column}"

    if manual:
        unmarked = any(f.transform == FOUND_IN_THE_RESULT for f in manual)
        lines.append(
            "Left for you to do (marked '# dp2ddp:' in the code"
            + (", but for what lint still finds in the converted code" if unmarked else "")
            + "):"
        )
        for f in sorted(manual, key=lambda f: (f.path, f.line)):
            lines.append(f"  {place(f)}: {f.code} {f.message}")
    if notes:
        lines.append("Notes:")
        for f in sorted(notes, key=lambda f: (f.path, f.line)):
            lines.append(f"  {place(f)}: {f.code} {f.message}")
    still = [(f.path, line) for f in sorted(result.files, key=lambda f: f.path) for line in f.still_linted]
    if still:
        lines.append("dp2ddp lint will still report on the converted code (warnings, lint's default --fail-on):")
        lines.extend(f"  {path}:{line}" for path, line in still)
    # "converted" means converted: a file with a spot left for a human is incomplete
    partial = [f for f in result.files if f.error is None and incomplete(f.findings)]
    done = written if mode == "write" else result.changed
    complete = [f for f in done if not incomplete(f.findings)]
    unchanged = [f for f in result.files if not f.changed and f.error is None and not incomplete(f.findings)]
    failed = result.errors
    verb = {"write": "converted", "check": "would be converted"}.get(mode or "", "would be converted")
    parts = [f"{len(complete)} file{'s' if len(complete) != 1 else ''} {verb}"]
    if partial:
        spots = f"{len(manual)} spot{'s' if len(manual) != 1 else ''} left for you"
        parts.append(f"{len(partial)} incomplete ({spots})")
    parts.append(f"{len(unchanged)} left unchanged")
    if failed:
        parts.append(f"{len(failed)} could not be converted")
    lines.append(", ".join(parts) + ".")
    written_paths = {f.path for f in written}
    # (with --write: only the entries actually written -- not a read-only one)
    entries = [f.path for f in result.entries if f.changed and (mode != "write" or f.path in written_paths)]
    if entries and mode != "check":
        lines.extend(launch.instructions(entries, nproc))
    return lines


def _marked_lines(written: Sequence[FileResult], manual) -> dict:
    """id(finding) -> (line, column) of the statement its ``# dp2ddp:`` marker stands
    above, in the written file: exact, also where the statement itself was rewritten."""
    places = {}
    for file in written:
        if file.output is None:
            continue
        lines = _text(file.output).splitlines()
        at = {}  # marker text -> the lines of the statements it marks, in order
        for index, text in enumerate(lines):
            if text.strip().startswith("# dp2ddp:"):
                below = next((j for j in range(index + 1, len(lines)) if not lines[j].strip().startswith("#")), None)
                if below is not None:
                    at.setdefault(text.strip(), []).append(below)
        own = sorted((f for f in manual if f.path == file.path), key=lambda f: (f.line, f.column))
        for f in own:
            found = at.get(f"# dp2ddp: {f.code} {f.message}")
            if found:
                below = found.pop(0)
                text = lines[below]
                places[id(f)] = (below + 1, len(text) - len(text.lstrip()) + 1)
    return places


def exit_code(result: ConvertResult, mode: Optional[str], write_errors: Sequence[str] = ()) -> int:
    if any(f.internal for f in result.files):
        return EXIT_INTERNAL
    if result.errors or write_errors:
        return EXIT_FINDINGS
    if mode == "check" and result.changed:
        return EXIT_FINDINGS
    if any(incomplete(f.findings) for f in result.files):
        return EXIT_FINDINGS  # converted only in part: a spot is left for a human
    return EXIT_OK
