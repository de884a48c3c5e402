"""The command line: a thin click layer over the engine (I/O and exit codes only).

Exit codes (one place, like black's ``report.py``):

* 0 -- nothing left to do, or written;
* 1 -- changes pending under ``--check``, or some file could not be converted;
* 2 -- usage error (click's own);
* 123 -- internal error: a bug in dp2ddp;
* 141 -- the reader of the output went away (``dp2ddp convert . | head``), as
  for a tool that SIGPIPE ends; quietly (a diff is printed before anything is
  written, so ``--write --diff`` then writes nothing).
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Dict, List, Optional

import click

from dp2ddp import __version__

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_BROKEN_PIPE = 0, 1, 2, 123, 141


def _internal_errors(func):
    """Turn an unexpected exception into exit 123 with a clear message."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BrokenPipeError:
            # stdout's reader is gone (``| head``): no traceback, and nothing more
            # written there (Python would complain again when it flushes at exit)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_BROKEN_PIPE)
        except KeyboardInterrupt:
            if func.__name__ == "verify":
                click.echo("dp2ddp: interrupted; the run's processes were stopped", err=True)
            elif kwargs.get("write") or kwargs.get("interactive") or kwargs.get("fix"):
                click.echo("dp2ddp: interrupted; every file is either as it was or fully written", err=True)
            else:  # --check, the diff, a lint without --fix
                click.echo("dp2ddp: interrupted; nothing was written", err=True)
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


def _nproc(value: str) -> str:
    """torchrun's --nproc_per_node: a positive number, or gpu, cpu, auto, xpu."""
    if value in ("gpu", "cpu", "auto", "xpu") or (value.isdigit() and int(value) > 0):
        return value
    raise click.BadParameter(f"{value!r}: give a positive number or one of gpu, cpu, auto, xpu")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dp2ddp")
def cli() -> None:
    """Migrate PyTorch DataParallel and single-GPU training scripts to DistributedDataParallel."""


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--write", is_flag=True, help="Rewrite the files in place.")
@click.option("-i", "--interactive", is_flag=True, help="Review each change (y/n/a/q), then write what you accepted.")
@click.option("--check", is_flag=True, help="Rewrite no file; exit 1 if one would change.")
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
@click.option(
    "--sync-bn",
    is_flag=True,
    help="Convert the model's BatchNorm layers to SyncBatchNorm before the DDP wrap "
    "(statistics over the global batch; GPU runs only, CPU keeps BatchNorm).",
)
@click.option("--no-markers", is_flag=True, help="Do not put '# dp2ddp:' comments at spots left for you.")
@click.option(
    "--nproc-per-node", default="gpu", show_default=True, callback=lambda ctx, param, value: _nproc(value),
    help="Processes per machine in the printed torchrun line and the launch files: a number, "
    "or gpu/cpu/auto as torchrun takes it.",
)
@click.option("--exclude", multiple=True, metavar="PATTERN", help="gitignore-style pattern of paths to skip (repeatable).")
@click.option("--include", multiple=True, metavar="PATTERN", help="Only take files matching these patterns.")
@click.option("--color/--no-color", default=None, help="Colour the diff (default: when stdout is a terminal and NO_COLOR is unset).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@click.option("--verify", "run_verify", is_flag=True, help="With --write: then run `dp2ddp verify` on each converted entry point.")
@click.option("--allow-dirty", is_flag=True, help="With --write: also rewrite files that have uncommitted git changes.")
@click.option("-j", "--jobs", type=click.IntRange(0), default=0, help="Processes (default: all cores).")
@click.option("--no-cache", is_flag=True, help="Convert every file, even ones converted before with the same content and role.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a migration report to this file.")
@click.option("--report-format", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--emit-launch", "launch_dir", type=click.Path(file_okay=False, path_type=Path), help="Write torchrun, multi-node and Slurm launch scripts for each converted entry point into this folder.")
@_internal_errors
def convert(
    paths: List[Path],
    write: bool,
    interactive: bool,
    check: bool,
    show_diff: Optional[bool],
    batch_size: str,
    sync_bn: bool,
    no_markers: bool,
    nproc_per_node: str,
    exclude: List[str],
    include: List[str],
    color: Optional[bool],
    quiet: bool,
    run_verify: bool,
    allow_dirty: bool,
    jobs: int,
    no_cache: bool,
    report_path: Optional[Path],
    report_format: str,
    launch_dir: Optional[Path],
) -> None:
    """Convert the scripts under PATHS to DistributedDataParallel.

    Prints a unified diff by default; --write rewrites the files, --check only
    reports whether any would change.
    """
    from dp2ddp import report
    from dp2ddp.cache import disabled_by_environment
    from dp2ddp.codemods._model import Settings
    from dp2ddp.files import skip_is_error
    from dp2ddp.runner import ConvertRun

    if write and check:
        raise click.UsageError("--write and --check exclude each other")
    if interactive and check:
        raise click.UsageError("--interactive and --check exclude each other")
    if check and launch_dir is not None:
        raise click.UsageError("--check writes nothing: --emit-launch goes with --write (or the diff mode)")
    if interactive and (report_path is not None or launch_dir is not None):
        raise click.UsageError(
            "--report and --emit-launch describe the whole conversion, --interactive writes "
            "only what you accept: run them separately (--emit-launch also works afterwards)"
        )
    if interactive:
        write = True
    if run_verify and not write:
        raise click.UsageError("--verify runs the converted scripts: add --write")
    mode = "write" if write else "check" if check else None
    settings = Settings(batch_size=batch_size, sync_bn=sync_bn, markers=not no_markers)
    cache = None
    if not (no_cache or disabled_by_environment()):
        from dp2ddp.cache import for_project, project_root

        cache = for_project(project_root(paths))
    # the fixed-point check guards writes: a dry run (diff, --check) skips it
    run = ConvertRun(
        paths, settings, exclude=exclude, include=include, workers=jobs or os.cpu_count() or 1,
        verify=mode == "write", cache=cache, clean_temporary=mode == "write",
    )
    progress = _progress_bars() if not quiet else None
    try:
        result = run.convert(progress)
    except run.UsageError as exc:
        raise click.UsageError(str(exc))
    finally:
        if progress is not None:
            progress.close()
    for path in [] if quiet else run.removed_temporary:
        click.echo(f"removed {path}: left by an interrupted write", err=True)
    for path, why in run.skipped:
        if skip_is_error(why):  # a folder that could not be listed was not converted
            run.write_errors.append(f"{path}: {why}")
        elif not quiet:
            click.echo(f"warning: skipped {path}: {why}", err=True)
    if show_diff is None:
        show_diff = mode is None and not interactive
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")  # no-color.org
    if mode == "write" and not allow_dirty:
        dirty = run.dirty_files(result)
        if dirty:
            listing = "\n".join(f"  {p}" for p in dirty)
            click.echo(
                "dp2ddp: refusing to rewrite files with uncommitted changes (your edits could "
                f"not be told apart from the conversion):\n{listing}\n"
                "Commit or stash them first, or pass --allow-dirty.",
                err=True,
            )
            sys.exit(EXIT_FINDINGS)
    if show_diff:
        for file in result.changed:
            click.echo(report.diff(file, color=color), nl=False, color=color)
    if interactive:
        code = _interactive(run, result)
        sys.exit(code)
    written = run.write(result) if mode == "write" else []
    if report_path is not None:
        from dp2ddp import migration

        migration.write_report(report_path, result, report_format, batch_size, nproc_per_node)
        if not quiet:
            click.echo(f"migration report written to {report_path}", err=True)
    if launch_dir is not None:
        from dp2ddp import migration

        # the entry points converted now (written), or by an earlier run
        written_paths = {f.path for f in written}
        entries = [
            f.path for f in result.entries
            if (f.changed and f.path in written_paths) or (not f.changed and f.role.already_distributed)
        ]
        for file in result.entries:
            if file.changed and file.path not in entries:
                click.echo(
                    f"{file.path}: no launch files: it is not converted yet (add --write)", err=True
                )
        for path in migration.emit_launch(launch_dir, entries, nproc_per_node):
            if not quiet:
                click.echo(f"launch file written: {path}", err=True)
    if not quiet:
        for line in report.summary(result, mode=mode, written=written, nproc=nproc_per_node):
            click.echo(line, err=True)
    else:
        for file in result.errors:
            click.echo(file.error, err=True)
        for line in report.would_change(result) if mode == "check" else []:
            click.echo(line, err=True)
    for error in run.write_errors:
        click.echo(f"error: {error}", err=True)
    code = report.exit_code(result, mode, run.write_errors)
    if run_verify and code == EXIT_OK:
        from dp2ddp import verify as V

        for entry in [f for f in written if f.role is not None and f.role.is_entry]:
            options = V.VerifyOptions(script=entry.path, nproc_per_node=V.default_nproc())
            verdict = V.verify(options)
            click.echo(V.text(verdict), nl=False, err=True)
            if not verdict.ok:
                code = EXIT_FINDINGS
    sys.exit(code)


def _interactive(run, result) -> int:
    """Ask about each hunk; write the accepted ones if the selection is consistent."""
    from dp2ddp import report
    from dp2ddp.review import review

    for file in result.errors:
        click.echo(f"error: {file.error}", err=True)
    if not result.changed:
        click.echo("Nothing to convert.", err=True)
        return report.exit_code(result, "write")

    answers = {"y": "y", "yes": "y", "n": "n", "no": "n", "a": "a", "all": "a", "q": "q", "quit": "q"}

    def ask(hunk, question, default):
        answer = click.prompt(
            f"{question} [y]es [n]o [a]ll remaining [q]uit",
            type=click.Choice(list(answers), case_sensitive=False),
            show_choices=False,
            default=default,
            err=True,
        )
        return answers[answer.lower()]

    def go_back(problems):
        click.echo("dp2ddp: this selection is inconsistent:", err=True)
        for problem in problems:
            click.echo(f"  {problem}", err=True)
        try:
            again = click.prompt(
                "Go back over the changes (your answers are kept as defaults)? [b]ack [x] write nothing",
                type=click.Choice(["b", "back", "x", "exit"], case_sensitive=False),
                show_choices=False,
                err=True,
            )
        except click.Abort:  # (end of input, Ctrl-D: nothing is written)
            return False
        return again.lower() in ("b", "back")

    outputs, problems = review(result, ask, lambda text: click.echo(text, err=True), go_back)
    if problems:
        click.echo("dp2ddp: not written -- the selection is inconsistent (above).", err=True)
        click.echo("Accept the changes it relies on too, or reject the ones that rely on them.", err=True)
        return EXIT_FINDINGS
    written = run.write_outputs(outputs)
    click.echo(f"{len(written)} file{'s' if len(written) != 1 else ''} written.", err=True)
    for error in run.write_errors:
        click.echo(f"error: {error}", err=True)
    return EXIT_FINDINGS if run.write_errors or result.errors else EXIT_OK


def _progress_wanted() -> bool:
    """Progress bars go to stderr on a terminal, never into a pipe, a file or a CI log."""
    ci = os.environ.get("CI", "").strip().lower()
    return sys.stderr.isatty() and ci in ("", "0", "false", "no") and os.environ.get("TERM") != "dumb"


class _ProgressBars:
    """``progress(phase, done, total)``: a tqdm bar on stderr per phase, shown
    once a phase has run half a second (a short run draws nothing), and erased
    when it ends."""

    def __init__(self) -> None:
        self.phase: Optional[str] = None
        self.bar = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if phase != self.phase or self.bar is None:
            self.close()
            self.phase = phase
            self.bar = tqdm(
                total=total, desc=f"dp2ddp: {phase}", unit=" files", file=sys.stderr, leave=False,
                delay=0.5, dynamic_ncols=True,
            )
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _progress_bars() -> Optional[_ProgressBars]:
    return _ProgressBars() if _progress_wanted() else None


def _codes(values) -> tuple:
    out = []
    for value in values:
        out += [v.strip().upper() for v in value.split(",") if v.strip()]
    return tuple(out)


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "sarif", "github"]), default="text",
    show_default=True, help="Output format.",
)
@click.option("--select", multiple=True, metavar="CODES", help="Only these codes or prefixes (comma-separated).")
@click.option(
    "--extend-select", multiple=True, metavar="CODES",
    help="Also these codes or prefixes, beside the selection or the default set (DDP301 is off by default).",
)
@click.option("--ignore", multiple=True, metavar="CODES", help="Skip these codes or prefixes (comma-separated).")
@click.option(
    "--fail-on", type=click.Choice(["error", "warning", "info"]), default=None,
    help="Lowest severity that fails the run (default: warning, or fail-on in pyproject.toml).",
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--fix", is_flag=True, help="Apply safe fixes.")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix, apply unsafe fixes too.")
@click.option(
    "--fix-edits", "fix_edits_wanted", is_flag=True,
    help="With --format json/sarif: give each fix's edits (the replacement lines); slower: it runs the fixes.",
)
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), help="pyproject.toml to use.")
@click.option("--no-config", is_flag=True, help="Ignore pyproject.toml.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="gitignore-style pattern of paths to skip.")
@click.option("-q", "--quiet", is_flag=True, help="No summary line, no warnings about skipped paths.")
@click.option("--no-cache", is_flag=True, help="Analyse every file, even unchanged ones.")
@click.option("-j", "--jobs", type=click.IntRange(0), default=0, help="Processes (default: all cores, for large runs).")
@_internal_errors
def lint(paths, fmt, select, extend_select, ignore, fail_on, exit_zero, fix, unsafe_fixes, fix_edits_wanted, config_path, no_config, exclude, quiet, no_cache, jobs):
    """Report DataParallel usage and DDP pitfalls in PATHS (default: .).

    Text output is `path:line:col: CODE message`; a `[*]` marks findings that
    --fix can fix. Exit 0: nothing at or above the failing severity; 1: findings;
    2: usage or configuration error; 123: internal error.
    """
    if no_config and config_path is not None:
        raise click.UsageError("--config and --no-config exclude each other")
    if unsafe_fixes and not fix:
        raise click.UsageError("--unsafe-fixes goes with --fix (--fix --unsafe-fixes)")
    if fix_edits_wanted and fmt not in ("json", "sarif"):
        raise click.UsageError("--fix-edits goes with --format json or sarif")
    import dataclasses

    from dp2ddp import formats
    from dp2ddp.codemods.rules import RULES
    from dp2ddp.config import ConfigError, check_selectors, find_pyproject, load_config
    from dp2ddp.lint import drop_failed_fixes, failing, fix_edits, fixable, lint_sources
    from dp2ddp.runner import ConvertRun, LintRun

    from dp2ddp.cache import LintCache, disabled_by_environment
    from dp2ddp.files import skip_is_error

    no_cache = no_cache or disabled_by_environment()
    paths = list(paths) or [Path(".")]
    known = [r.CODE for r in RULES]

    def configured(source):
        config = load_config(source)
        overrides = {}
        if select:  # the command line's selection replaces the file's
            overrides["select"] = _codes(select)
            overrides["ignore"] = _codes(ignore)
        elif ignore:
            overrides["ignore"] = config.ignore + _codes(ignore)
        if extend_select:
            overrides["extend_select"] = (() if select else config.extend_select) + _codes(extend_select)
        if fail_on:
            overrides["fail_on"] = fail_on
        config = dataclasses.replace(config, **overrides)
        def where(key: str, on_command_line: bool) -> str:
            if on_command_line or source is None:
                return f"--{key}"
            return f"{source}: [tool.dp2ddp] {key}"

        check_selectors(config.select, known, where("select", bool(select)))
        check_selectors(config.extend_select, known, where("extend-select", bool(extend_select)))
        for code in config.ignore:  # (from the file, the command line, or both)
            check_selectors([code], known, where("ignore", code in _codes(ignore)))
        for pattern, codes in config.per_file_ignores:
            check_selectors(codes, known, where(f"per-file-ignores.{pattern}", False))
        return config

    # each path is linted with the configuration found above it (paths of two
    # projects: two configurations), unless one is forced
    groups: Dict[Optional[Path], List[Path]] = {}
    try:
        for path in paths:
            source = None if no_config else (config_path or find_pyproject([path]))
            groups.setdefault(source, []).append(path)
        configs = {source: configured(source) for source in groups}
    except ConfigError as exc:
        raise click.UsageError(str(exc))
    workers = jobs or os.cpu_count() or 1
    diagnostics = []
    files = 0
    fixed_paths: List[str] = []
    write_errors: List[str] = []
    warnings: List[str] = []
    internal_errors: List[str] = []
    bad = False
    for source, group in groups.items():
        config = configs[source]
        cache = None if no_cache else LintCache(config.root or Path.cwd(), config)
        run = LintRun(group, config, extra_exclude=exclude, clean_temporary=fix)
        try:
            sources = run.read(cache)
        except ConvertRun.UsageError as exc:
            raise click.UsageError(str(exc))
        for path in [] if quiet else run.removed_temporary:
            click.echo(f"removed {path}: left by an interrupted write", err=True)
        for path, why in run.skipped:
            # a folder that cannot be listed is a part of the run that was not checked
            (write_errors if skip_is_error(why) else warnings).append(f"{path}: {why}")
        bars = _progress_bars() if not quiet else None
        progress = functools.partial(bars, "linting") if bars is not None else None
        try:
            result = lint_sources(sources, config, workers=workers, cache=cache, progress=progress, release=not fix)
        finally:
            if bars is not None:
                bars.close()
        # a file that could not be read is dropped from ``sources``: said once
        write_errors += result.unreadable
        if fix:
            # a fix can open the way to another (DDP001's wrap, then DDP303's
            # .module): fix again while that helps, a few rounds at most
            for _ in range(3):
                before = result.diagnostics
                fixed = run.fix(sources, before, unsafe_fixes)
                if fixed:
                    result = lint_sources(sources, config, workers=workers, cache=cache)
                    write_errors += result.unreadable
                drop_failed_fixes(before, result.diagnostics, unsafe_fixes)
                fixed_paths += [p for p in fixed if p not in fixed_paths]
                if not fixed or not any(fixable(d, unsafe_fixes) for d in result.diagnostics):
                    break
        # a rule that crashed on a file (of the files as they are now) is a bug in
        # dp2ddp: said after the findings of every other rule and file, exit 123
        internal_errors += [f"{crash}This is a bug in dp2ddp, please report it." for crash in result.crashes]
        if cache is not None:
            cache.save()
        if fmt in ("json", "sarif") and fix_edits_wanted:
            fix_edits(sources, result.diagnostics)
        diagnostics += result.diagnostics
        files += result.files
        bad = bad or bool(failing(result.diagnostics, config.fail_on))
        write_errors += run.write_errors
        internal_errors += run.internal_errors
    diagnostics.sort(key=lambda d: d.sort_key)
    safe_codes = sorted({d.code for d in diagnostics if fixable(d, False)})
    if fmt == "text":
        out = formats.text(diagnostics, safe_codes)
        if not quiet:
            safe = sum(1 for d in diagnostics if fixable(d, False))
            unsafe = sum(1 for d in diagnostics if fixable(d, True)) - safe
            if fixed_paths:
                out += f"Fixed {len(fixed_paths)} file{'s' if len(fixed_paths) != 1 else ''}.\n"
            out += formats.summary(diagnostics, safe, unsafe, files) + "\n"
        click.echo(out, nl=False)
    elif fmt == "json":
        click.echo(formats.to_json(diagnostics), nl=False)
    elif fmt == "sarif":
        click.echo(formats.sarif(diagnostics, root=os.getcwd()), nl=False)
    else:
        click.echo(formats.github(diagnostics), nl=False)
    for warning in [] if quiet else warnings:
        click.echo(f"warning: skipped {warning}", err=True)
    for error in write_errors:
        click.echo(f"error: {error}", err=True)
    for error in internal_errors:
        click.echo(f"dp2ddp: internal error: {error}", err=True)
    if internal_errors:
        sys.exit(EXIT_INTERNAL)
    if exit_zero:
        sys.exit(EXIT_OK)
    sys.exit(EXIT_FINDINGS if bad or write_errors else EXIT_OK)


@cli.command()
@click.argument("code", required=False)
@click.option("--all", "show_all", is_flag=True, help="List every rule.")
@click.option("--markdown", is_flag=True, help="Print docs/rules.md (all rules, generated).")
@_internal_errors
def rule(code, show_all, markdown):
    """Explain a lint rule: what it does, why it is bad, what to do instead."""
    from dp2ddp import rule_docs
    from dp2ddp.codemods.rules import BY_CODE, RULES

    if markdown:
        click.echo(rule_docs.markdown(), nl=False)
        return
    if show_all or not code:
        for r in RULES:
            fix = f"fix: {r.FIX}" if r.FIX else "no fix"
            click.echo(f"{r.CODE}  {r.NAME:<36} {r.SEVERITY:<8} {fix}")
        return
    r = BY_CODE.get(code.upper())
    if r is None:
        doc = rule_docs.convert_code(code.upper())
        if doc is None:
            raise click.UsageError(f"unknown rule {code!r} (see `dp2ddp rule --all`)")
        click.echo(doc, nl=False)
        return
    click.echo(rule_docs.one(r))


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nproc-per-node", type=click.IntRange(1), default=None, help="Processes per machine (default: GPUs, or 2 on CPU).")
@click.option("--nnodes", type=click.IntRange(1), default=1, show_default=True, help="Simulated machines (torchrun agents with c10d rendezvous on 127.0.0.1).")
@click.option("--max-steps", type=click.IntRange(1), default=20, show_default=True, help="Optimizer steps, then every rank stops.")
@click.option("--epoch-batches", type=click.IntRange(0), default=0, help="Batches per epoch (default: max-steps // 4), so that several epochs run.")
@click.option("--timeout", type=click.FloatRange(1), default=120.0, show_default=True, help="Seconds without progress before the run counts as hung.")
@click.option("--against", type=click.Path(exists=True, dir_okay=False), default=None, help="The original script: run it single-process and compare the final weights.")
@click.option("--tolerance", type=float, default=1e-4, show_default=True, help="Largest weight difference accepted by --against.")
@click.option("--launcher", type=click.Choice(["auto", "fork", "torchrun"]), default="auto", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--keep", is_flag=True, help="Keep the run folder (records, logs, stacks).")
@click.option(
    "--workdir", type=click.Path(file_okay=False, exists=True), default=None,
    help="Run the script in this folder (default: a scratch copy of the current one, "
    "so its checkpoints never overwrite or resume from yours).",
)
@_internal_errors
def verify(script, script_args, nproc_per_node, nnodes, max_steps, epoch_batches, timeout, against, tolerance, launcher, fmt, keep, workdir):
    """Run SCRIPT under DDP for a step budget and check that it is really distributed.

    Arguments after `--` go to the script. The ranks run in a scratch folder that
    mirrors the current one (small files copied, folders linked). Exit 0 when
    every check passed; 1 when one failed or could not run (the script never
    trained); 2 on a usage error; 123 on an internal error.
    """
    from dp2ddp import verify as V

    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.UsageError("verify needs torch: pip install torch")
    options = V.VerifyOptions(
        script=str(script),
        args=list(script_args),
        nproc_per_node=nproc_per_node or V.default_nproc(),
        nnodes=nnodes,
        max_steps=max_steps,
        epoch_batches=epoch_batches,
        timeout=timeout,
        against=against,
        tolerance=tolerance,
        launcher=launcher,
        keep=keep,
        workdir=os.path.abspath(workdir) if workdir else None,
    )
    report = V.verify(options)
    click.echo(V.to_json(report) if fmt == "json" else V.text(report), nl=False)
    sys.exit(EXIT_OK if report.ok else EXIT_FINDINGS)


def main() -> None:
    cli(prog_name="dp2ddp")


if __name__ == "__main__":  # pragma: no cover
    main()
