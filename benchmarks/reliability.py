"""Reliability on large real code: `convert --check` and `lint` over every .py file
of the installed CPython standard library and of the installed torch package.

    python benchmarks/reliability.py [--corpus stdlib|torch|PATH ...] [-j N]

For each corpus it prints: files, crashes (must be 0), internal errors (0),
files that would change among the files that never mention DataParallel or a
DataLoader (0), outputs that do not parse (0), non-idempotent outputs (0), files
that do not compile with CPython (reported as such, not crashes), and the time.
Exits 1 if a must-be-0 figure is not 0.  Not part of the test-suite.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def corpus_path(name: str) -> Path:
    if name == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    if name == "torch":
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("torch is not installed")
        return Path(list(spec.submodule_search_locations)[0])
    return Path(name)


def files_of(root: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*.py") if p.is_file() and "site-packages" not in p.relative_to(root).parts)


def check_corpus(name: str) -> Dict[str, object]:
    from dp2ddp.engine import convert_sources
    from dp2ddp.lint import lint_sources

    root = corpus_path(name)
    paths = files_of(root)
    sources = {}
    for path in paths:
        try:
            sources[str(path)] = path.read_bytes()
        except OSError:
            pass
    not_compiling = 0
    for path, data in sources.items():
        try:
            ast.parse(data)
        except Exception:
            not_compiling += 1

    figures: Dict[str, object] = {"corpus": f"{name} ({root})", "files": len(sources)}
    # convert --check (the engine without its own verification, so that we count
    # unparseable and non-idempotent outputs ourselves)
    started = time.perf_counter()
    crashes = internal = changed_unrelated = unparseable = not_idempotent = changed = 0
    try:
        result = convert_sources(sources, verify=False, explicit=set())
    except Exception:
        traceback.print_exc()
        crashes += 1
        result = None
    convert_time = time.perf_counter() - started
    if result is not None:
        outputs = {}
        for file in result.files:
            if file.internal:
                internal += 1
                print(f"  internal error: {file.error.splitlines()[0]}", file=sys.stderr)
            if not file.changed:
                continue
            changed += 1
            text = file.source
            if b"DataParallel" not in text and b"DataLoader" not in text:
                changed_unrelated += 1
                print(f"  changed without DataParallel/DataLoader: {file.path}", file=sys.stderr)
            try:
                ast.parse(file.output)
            except Exception:
                unparseable += 1
                print(f"  output does not parse: {file.path}", file=sys.stderr)
            outputs[file.path] = file.output
        if outputs:
            merged = dict(sources)
            merged.update(outputs)
            again = convert_sources(merged, verify=False, explicit=set())
            for file in again.files:
                if file.path in outputs and file.changed:
                    not_idempotent += 1
                    print(f"  not idempotent: {file.path}", file=sys.stderr)
    # lint
    started = time.perf_counter()
    lint_crashes = 0
    findings = 0
    linted = lint_sources(sources)
    findings = len(linted.diagnostics)
    for crash in linted.crashes:
        lint_crashes += 1
        print(f"  lint crashed: {crash.splitlines()[0]}", file=sys.stderr)
    lint_time = time.perf_counter() - started
    figures.update(
        {
            "do not compile (CPython)": not_compiling,
            "convert: crashes": crashes,
            "convert: internal errors": internal,
            "convert: files that would change": changed,
            "convert: changed, never mention DataParallel/DataLoader": changed_unrelated,
            "convert: outputs that do not parse": unparseable,
            "convert: non-idempotent outputs": not_idempotent,
            "convert: time (s)": round(convert_time, 1),
            "lint: crashes": lint_crashes,
            "lint: findings": findings,
            "lint: time (s)": round(lint_time, 1),
        }
    )
    return figures


MUST_BE_ZERO = (
    "convert: crashes",
    "convert: internal errors",
    "convert: changed, never mention DataParallel/DataLoader",
    "convert: outputs that do not parse",
    "convert: non-idempotent outputs",
    "lint: crashes",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", action="append", default=None, help="stdlib, torch or a folder (repeatable)")
    args = parser.parse_args()
    bad = False
    for name in args.corpus or ["stdlib", "torch"]:
        figures = check_corpus(name)
        print(f"\n{figures.pop('corpus')}")
        for key, value in figures.items():
            flag = "  <-- must be 0" if key in MUST_BE_ZERO and value else ""
            print(f"  {key:<58} {value}{flag}")
            bad |= bool(flag)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
