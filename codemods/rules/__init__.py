"""The lint rules: one module per rule; adding the module is the registration."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, List, Type

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

__all__ = ["Diagnostic", "Rule", "RULES", "BY_CODE", "SECTIONS", "SEVERITIES"]
