"""DDP900 syntax-error."""

from __future__ import annotations

from typing import Iterator

from .._analysis import Source
from ._base import Diagnostic, Rule


class SyntaxErrorRule(Rule):
    """
    ## What it does
    Reports a file that does not parse as Python (Python 2 syntax, a merge
    conflict, an unfinished edit), at the line of the error. The other files are
    still checked. Only files that lint has to parse are concerned: a file in
    which no selected rule can fire (it never mentions torch, or none of the
    rules' trigger words) is not parsed at all.

    ## Why is this bad?
    Nothing in the file can be checked (or converted) until it parses.

    ## Example
    ```python
    print "epoch", epoch
    ```

    ## Use instead
    ```python
    print("epoch", epoch)
    ```

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP900"
    NAME = "syntax-error"
    SEVERITY = "error"
    MESSAGE = "cannot parse"

    def check(self, src: Source) -> Iterator[Diagnostic]:
        return iter(())  # reported by the lint engine when parsing fails
