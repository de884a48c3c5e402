"""DDP901 unused-noqa."""

from __future__ import annotations

from typing import Iterator

from .._analysis import Source
from ._base import Diagnostic, Rule


class UnusedNoqa(Rule):
    """
    ## What it does
    Reports a `# noqa: DDP302` comment that suppresses nothing on its line: no
    finding of that code is there, or that names a DDP code no rule has (a
    typo: `# noqa: DDP32`). Codes of other tools (`# noqa: E501`) are
    ignored, and so is a bare `# noqa`, which may be meant for another tool.

    ## Why is this bad?
    A stale suppression hides the next real finding on that line, and tells the
    reader there is a problem where there is none.

    ## Example
    ```python
    dist.barrier()  # noqa: DDP305
    ```
    where the barrier is not (any more) inside a rank branch.

    ## Use instead
    ```python
    dist.barrier()
    ```

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP901"
    NAME = "unused-noqa"
    SEVERITY = "info"
    MESSAGE = "unused noqa: nothing is suppressed here"

    def check(self, src: Source) -> Iterator[Diagnostic]:
        return iter(())  # reported by the lint engine after suppression
