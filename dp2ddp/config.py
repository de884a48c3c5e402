"""``[tool.dp2ddp]`` in ``pyproject.toml``: lint selection, suppression and failing severity.

```toml
[tool.dp2ddp]
select = ["DDP"]                 # codes or prefixes (default: all)
ignore = ["DDP301"]
fail-on = "warning"              # error | warning | info
exclude = ["legacy/", "*_pb2.py"]  # gitignore-style, relative to this file

[tool.dp2ddp.per-file-ignores]
"tests/*" = ["DDP302"]
```

The file is found by walking up from the paths given; flags on the command line
override it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

SEVERITIES = ("info", "warning", "error")
KEYS = {"select", "ignore", "fail-on", "exclude", "per-file-ignores", "extend-select"}


class ConfigError(Exception):
    """A bad pyproject.toml or option value (exit code 2)."""


@dataclass(frozen=True)
class LintConfig:
    select: Tuple[str, ...] = ()
    #: added to the selection (``select``, or the default set): a rule that is off by
    #: default, turned on (``extend-select = ["DDP301"]``)
    extend_select: Tuple[str, ...] = ()
    ignore: Tuple[str, ...] = ()
    fail_on: str = "warning"
    exclude: Tuple[str, ...] = ()
    per_file_ignores: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    #: folder the patterns are relative to (the pyproject.toml's)
    root: Optional[Path] = None
    source: Optional[Path] = None


def _load_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - older Pythons
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc


def find_pyproject(paths: Sequence[Path]) -> Optional[Path]:
    """The nearest pyproject.toml with a [tool.dp2ddp] table above the paths."""
    # (realpath: a path that loops or dangles is named as it is, not an exception)
    starts = [Path(os.path.realpath(p)) for p in paths] or [Path.cwd()]
    start = starts[0] if len(starts) == 1 else Path(_common(starts))
    if start.is_file():
        start = start.parent
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            data = _load_toml(candidate)
            if "dp2ddp" in data.get("tool", {}):
                return candidate
    return None


def _common(paths: Sequence[Path]) -> str:
    import os

    return os.path.commonpath([str(p) for p in paths])


def _codes(value, key: str, where: Path) -> Tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: [tool.dp2ddp] {key} must be a list of rule codes")
    return tuple(v.strip().upper() for v in value)


def load_config(path: Optional[Path]) -> LintConfig:
    if path is None:
        return LintConfig()
    table = _load_toml(path).get("tool", {}).get("dp2ddp", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.dp2ddp] must be a table")
    unknown = set(table) - KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown [tool.dp2ddp] key(s): {', '.join(sorted(unknown))}")
    fail_on = table.get("fail-on", "warning")
    if fail_on not in SEVERITIES:
        raise ConfigError(f"{path}: fail-on must be one of {', '.join(SEVERITIES)}, not {fail_on!r}")
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{path}: per-file-ignores must be a table of pattern = [codes]")
    exclude = table.get("exclude", [])
    if isinstance(exclude, str):
        exclude = [exclude]  # (as select and ignore take one code)
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise ConfigError(f"{path}: exclude must be a list of patterns")
    return LintConfig(
        select=_codes(table.get("select", []), "select", path),
        extend_select=_codes(table.get("extend-select", []), "extend-select", path),
        ignore=_codes(table.get("ignore", []), "ignore", path),
        fail_on=fail_on,
        exclude=tuple(exclude),
        per_file_ignores=tuple((k, _codes(v, f"per-file-ignores.{k}", path)) for k, v in pfi.items()),
        root=path.parent,
        source=path,
    )


def matches(code: str, selectors: Sequence[str]) -> bool:
    """``DDP302`` matches ``DDP302``, ``DDP3``, ``DDP`` and ``ALL``."""
    return any(s == "ALL" or code.startswith(s) for s in selectors)


def check_selectors(selectors: Sequence[str], known: Sequence[str], where: str) -> None:
    for selector in selectors:
        if selector != "ALL" and not any(code.startswith(selector) for code in known):
            raise ConfigError(f"{where}: {selector!r} selects no rule")
