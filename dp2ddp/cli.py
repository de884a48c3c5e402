"""The command line: a thin click layer over the engine (I/O and exit codes only).

Exit codes (one place, like black's ``report.py``):

* 0 -- nothing left to do, or written;
* 1 -- changes pending under ``--check``, or some file could not be converted;
* 2 -- usage error (click's own);
* 123 -- internal error: a bug in dp2ddp.
"""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path
from typing import List, Optional

import click

from dp2ddp import __version__

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 123


def _internal_errors(func):
    """Turn an unexpected exception into exit 123 with a clear message."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("dp2ddp: interrupted; every file is either as it was or fully written", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug in dp2ddp
            click.echo(
                f"dp2ddp: internal error: {exc!r}\n"
                "This is a bug in dp2ddp, not in your code; please report it with the "
                "traceback below.\n" + traceback.format_exc(),
                err=True,
            )
            sys.exit(EXIT_INTERNAL)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dp2ddp")
def cli() -> None:
    """Migrate PyTorch DataParallel and single-GPU training scripts to DistributedDataParallel."""


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--write", is_flag=True, help="Rewrite the files in place.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a file would change.")
@click.option("--diff", "show_diff", is_flag=True, default=None, help="Print the diff (default unless --write/--check).")
@click.option(
    "--batch-size",
    "batch_size",
    type=click.Choice(["global", "per-process"]),
    default="global",
    show_default=True,
    help="global: DataParallel's batch_size is the global batch, each process loads "
    "batch_size // world_size (same training math). per-process: keep the number per "
    "process (global batch and learning rate change).",
)
@click.option("--no-markers", is_flag=True, help="Do not put '# dp2ddp:' comments at spots left for you.")
@click.option("--nproc-per-node", default="gpu", show_default=True, help="Processes per machine in the printed torchrun line.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="gitignore-style pattern of paths to skip (repeatable).")
@click.option("--include", multiple=True, metavar="PATTERN", help="Only take files matching these patterns.")
@click.option("--color/--no-color", default=None, help="Colour the diff (default: when stdout is a terminal).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@_internal_errors
def convert(
    paths: List[Path],
    write: bool,
    check: bool,
    show_diff: Optional[bool],
    batch_size: str,
    no_markers: bool,
    nproc_per_node: str,
    exclude: List[str],
    include: List[str],
    color: Optional[bool],
    quiet: bool,
) -> None:
    """Convert the scripts under PATHS to DistributedDataParallel.

    Prints a unified diff by default; --write rewrites the files, --check only
    reports whether any would change.
    """
    from dp2ddp import report
    from dp2ddp.codemods._base import Settings
    from dp2ddp.runner import ConvertRun

    if write and check:
        raise click.UsageError("--write and --check exclude each other")
    mode = "write" if write else "check" if check else None
    settings = Settings(batch_size=batch_size, markers=not no_markers)
    run = ConvertRun(paths, settings, exclude=exclude, include=include)
    try:
        result = run.convert()
    except run.UsageError as exc:
        raise click.UsageError(str(exc))
    if show_diff is None:
        show_diff = mode is None
    if color is None:
        color = sys.stdout.isatty()
    if show_diff:
        for file in result.changed:
            click.echo(report.diff(file, color=color), nl=False, color=color)
    written = run.write(result) if mode == "write" else []
    if not quiet:
        for line in report.summary(result, mode=mode, written=written, nproc=nproc_per_node):
            click.echo(line, err=True)
    else:
        for file in result.errors:
            click.echo(file.error, err=True)
    for error in run.write_errors:
        click.echo(f"error: {error}", err=True)
    sys.exit(report.exit_code(result, mode, run.write_errors))


def main() -> None:
    cli(prog_name="dp2ddp")


if __name__ == "__main__":  # pragma: no cover
    main()
