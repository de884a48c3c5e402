"""The lint rules: one module per rule; adding the module is the registration."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from typing import Dict, List, Optional, Type

from ._base import Diagnostic, Rule, SECTIONS, SEVERITIES


def _discover() -> List[Type[Rule]]:
    rules: List[Type[Rule]] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and value.CODE:
                if value.__module__ == module.__name__:
                    rules.append(value)
    return sorted(rules, key=lambda r: r.CODE)


RULES: List[Type[Rule]] = _discover()
BY_CODE: Dict[str, Type[Rule]] = {r.CODE: r for r in RULES}

#: a rule is in the default set when, on the lint set of real DDP repositories
#: (``benchmarks/realworld/lint_precision.py``), at least this share of its judged
#: findings are true and none of its false ones is an error
DEFAULT_PRECISION = 0.9
#: ... judged once it has at least this many findings there labelled true or false
#: (fewer are too few to tell a rule's precision: it stays in the default set)
DEFAULT_MIN_JUDGED = 5
#: those figures, per code, as the benchmark last wrote them (``--write-figures``)
FIGURES_FILE = os.path.join(os.path.dirname(__file__), "lint_set_figures.json")


def lint_set_figures() -> Dict[str, object]:
    """The benchmark's figures (``FIGURES_FILE``); empty when the file is absent."""
    try:
        with open(FIGURES_FILE, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}

__all__ = [
    "Diagnostic", "Rule", "RULES", "BY_CODE", "SECTIONS", "SEVERITIES", "DEFAULT_PRECISION", "DEFAULT_MIN_JUDGED",
    "default_earned", "lint_set_figures",
]


def default_earned(counts: Optional[Dict[str, int]]) -> bool:
    """What the figures of one rule (``lint_set_figures()["rules"][code]``, or None
    when it had no finding) say of its place in the default set."""
    if not counts:
        return True
    judged = counts["true"] + counts["false"]
    if counts["false_errors"]:
        return False
    return judged < DEFAULT_MIN_JUDGED or counts["true"] / judged >= DEFAULT_PRECISION
