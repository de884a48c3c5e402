"""Lint output formats: text (flake8/ruff style), JSON, SARIF 2.1.0, GitHub annotations."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

from dp2ddp import __version__
from dp2ddp.codemods.rules import BY_CODE, Diagnostic

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def text(diagnostics: Sequence[Diagnostic], fixable_codes: Sequence[str] = ()) -> str:
    lines = []
    for d in diagnostics:
        mark = " [*]" if d.code in fixable_codes and d.fix is not None else ""
        lines.append(f"{d.path}:{d.line}:{d.column}: {d.code}{mark} {d.message}")
    return "\n".join(lines) + ("\n" if lines else "")


def summary(diagnostics: Sequence[Diagnostic], fixable: int, unsafe_fixable: int, files: int) -> str:
    if not diagnostics:
        return f"All checks passed! ({files} file{'s' if files != 1 else ''})"
    counts = {s: sum(1 for d in diagnostics if d.severity == s) for s in ("error", "warning", "info")}
    parts = [f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n]
    line = f"Found {len(diagnostics)} finding{'s' if len(diagnostics) != 1 else ''} ({', '.join(parts)})"
    if fixable:
        line += f"; {fixable} fixable with --fix"
    if unsafe_fixable:
        # (like ruff's "hidden fixes": findings already counted, whose fix is unsafe)
        line += f"; {unsafe_fixable} {'has an unsafe fix' if unsafe_fixable == 1 else 'have unsafe fixes'}"
        line += " (--fix --unsafe-fixes)"
    return line + "."


def to_json(diagnostics: Sequence[Diagnostic]) -> str:
    return json.dumps([d.to_dict() for d in diagnostics], indent=2) + "\n"


#: SARIF's name for the folder that relative artifact URIs are resolved against
SRCROOT = "%SRCROOT%"


def sarif(diagnostics: Sequence[Diagnostic], root: Optional[str] = None) -> str:
    """A SARIF 2.1.0 log.  A finding's relative path is a URI relative to
    ``root`` (the folder the paths are relative to: the current one), named
    ``%SRCROOT%`` in ``originalUriBaseIds``; columns count code points
    (``columnKind``), as the text output's do."""
    from pathlib import Path

    root_uri = Path(root if root is not None else os.getcwd()).absolute().as_uri().rstrip("/") + "/"
    used = sorted({d.code for d in diagnostics} | set(BY_CODE))
    rules: List[Dict] = []
    index = {}
    for code in used:
        rule = BY_CODE.get(code)
        if rule is None:
            continue
        index[code] = len(rules)
        rules.append(
            {
                "id": rule.CODE,
                "name": rule.NAME,
                "shortDescription": {"text": rule.MESSAGE},
                "fullDescription": {"text": rule.docs()},
                "help": {"text": rule.docs(), "markdown": rule.docs()},
                "defaultConfiguration": {"level": _SARIF_LEVEL[rule.SEVERITY]},
                "properties": {"fix": rule.FIX or "none"},
            }
        )
    results = []
    for d in diagnostics:
        result = {
            "ruleId": d.code,
            "level": _SARIF_LEVEL[d.severity],
            "message": {"text": d.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": _artifact(d.path),
                        "region": {
                            "startLine": d.line,
                            "startColumn": d.column,
                            "endLine": max(d.end_line, d.line),
                            "endColumn": d.end_column if d.end_line > d.line else max(d.end_column, d.column),
                        },
                    }
                }
            ],
        }
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        results.append(result)
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "dp2ddp",
                        "version": __version__,
                        "informationUri": "https://pypi.org/project/dp2ddp/",
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {SRCROOT: {"uri": root_uri}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def github(diagnostics: Sequence[Diagnostic]) -> str:
    """GitHub Actions workflow commands (``::error file=...,line=...::message``)."""
    lines = []
    for d in diagnostics:
        props = ",".join(
            [
                f"file={_escape_property(d.path)}",
                f"line={d.line}",
                f"col={d.column}",
                f"endLine={d.end_line}",
                f"endColumn={d.end_column}",
                f"title={_escape_property(d.code + ' ' + d.name)}",
            ]
        )
        lines.append(f"::{_GITHUB_LEVEL[d.severity]} {props}::{_escape_data(d.code + ' ' + d.message)}")
    return "\n".join(lines) + ("\n" if lines else "")


def _artifact(path: str) -> Dict[str, str]:
    uri = _uri(path)
    return {"uri": uri} if uri.startswith("file:") else {"uri": uri, "uriBaseId": SRCROOT}


def _uri(path: str) -> str:
    """A SARIF artifact location: a relative URI reference (percent-encoded,
    ``my%20file.py``), or a ``file://`` URI for an absolute path."""
    from pathlib import PurePath
    from urllib.parse import quote

    pure = PurePath(path)
    if pure.is_absolute():
        return pure.as_uri()
    return quote(pure.as_posix())
