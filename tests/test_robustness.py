"""Never break a user's code: encodings, line endings, paths, git, concurrent edits,
failed and interrupted writes -- and property tests on generated scripts."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from dp2ddp.cli import cli
from dp2ddp.engine import convert_sources

DP = (FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py").read_text()
SMALL = 'import torch\nimport torch.nn as nn\n\n\ndef build(net):\n    return nn.DataParallel(net)  # é\n'


def convert(*args, cwd=None):
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(cli, ["convert", *map(str, args)], catch_exceptions=False)
    finally:
        os.chdir(old)


def one(data: bytes) -> bytes:
    (file,) = convert_sources({"script.py": data}).files
    assert file.error is None, file.error
    return file.output if file.output is not None else data


# ------------------------------------------------------------------ encodings, endings
@pytest.mark.parametrize(
    "name, data",
    [
        ("crlf", SMALL.replace("\n", "\r\n").encode()),
        ("bom", b"\xef\xbb\xbf" + SMALL.encode()),
        ("latin1-cookie", ("# -*- coding: latin-1 -*-\n" + SMALL).encode("latin-1")),
        ("no-final-newline", SMALL.rstrip("\n").encode()),
        ("tabs", SMALL.replace("    ", "\t").encode()),
    ],
)
def test_encoding_and_line_endings_are_kept(name, data):
    out = one(data)
    assert out != data and b"DistributedDataParallel(" in out
    if name == "crlf":
        assert out.count(b"\r\n") == out.count(b"\n")
    else:
        assert b"\r\n" not in out
    if name == "bom":
        assert out.startswith(b"\xef\xbb\xbf")
    if name == "latin1-cookie":
        assert "# é".encode("latin-1") in out and out.decode("latin-1").startswith("# -*- coding: latin-1")
    if name == "no-final-newline":
        assert not out.endswith(b"\n")
    if name == "tabs":
        assert b"\n\treturn DistributedDataParallel(" in out
    assert one(out) == out


def test_untouched_lines_keep_trailing_whitespace_and_tabs():
    source = DP.replace("import argparse\n", "import argparse   \n").replace(
        "def parse_args():\n", "def parse_args():\t\n"
    )
    out = one(source.encode()).decode()
    assert "import argparse   \n" in out and "def parse_args():\t\n" in out


def test_files_without_torch_are_never_touched(tmp_path):
    (tmp_path / "plain.py").write_text("class DataParallel:\n    pass\n\nprint('x')\n")
    (tmp_path / "mentions.py").write_text("# torch is mentioned but never imported\nprint('cuda')\n")
    result = convert("--check", tmp_path)
    assert result.exit_code == 0
    assert "0 files would be converted" in result.stderr


def test_torch_reached_through_a_star_import_is_reported_not_skipped_silently():
    """deeplab-xception's train.py takes torch from ``from modeling.deeplab import *``:
    LibCST's scopes cannot see through the star, so nothing there is converted -- and
    the report says why and what to do (it said the entry did not use torch)."""
    lib = b"import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n"
    train = (
        b"from mylib import *\n\n\ndef main():\n"
        b"    model = torch.nn.DataParallel(nn.Linear(4, 2)).cuda()\n"
        b"    loader = DataLoader(list(range(8)), batch_size=4, shuffle=True)\n\n\n"
        b"if __name__ == '__main__':\n    main()\n"
    )
    result = convert_sources({"mylib.py": lib, "train.py": train})
    (entry,) = [f for f in result.files if f.path == "train.py"]
    assert not entry.changed
    manual = [(f.code, f.line) for f in entry.findings if f.kind == "manual"]
    assert manual == [("DDP001", 1)]
    assert "from mylib import *" in entry.findings[0].message
    notes = [f.message for f in result.files[0].findings + entry.findings if f.kind == "note"]
    assert not any("no DataLoader" in n for n in notes)
    assert not any("not torch's" in f.message for f in entry.findings)  # (it may well be)
    # a star import of something else in a torch script changes nothing
    plain = b"import torch\nfrom os.path import *\nmodel = torch.nn.DataParallel(net)\n"
    (only,) = convert_sources({"train.py": plain}).files
    assert not any("import *" in f.message for f in only.findings)
    # nor in a file that binds those names itself (Flax's nn)
    flax = b"from flax import linen as nn\nfrom utils import *\n\nif __name__ == '__main__':\n    nn.Dense(3)\n"
    (only,) = convert_sources({"train.py": flax}).files
    assert only.findings == []
    # torch imported, nn from the star: what uses nn is not converted -- and said so
    mixed = train.replace(b"from mylib import *\n", b"import torch\nfrom mylib import *\n").replace(
        b"torch.nn.DataParallel(nn.Linear", b"nn.DataParallel(nn.Linear"
    )
    result = convert_sources({"mylib.py": lib, "train.py": mixed})
    (entry,) = [f for f in result.files if f.path == "train.py"]
    stars = [f for f in entry.findings if "import *" in f.message]
    assert [(f.code, f.kind, f.line) for f in stars] == [("DDP001", "manual", 2)]
    assert not any("not torch's" in f.message for f in entry.findings)


def _entry_notes(sources):
    result = convert_sources(sources)
    (entry,) = [f for f in result.files if f.role is not None and f.role.is_entry]
    return [f.message for f in entry.findings if f.kind == "note" and f.code == "DDP101" and f.line == 1]


TRAIN_FROM_ELSEWHERE = b"""import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train(data, epochs):
    valid_loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    model = nn.DataParallel(nn.Linear(4, 2)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(epochs):
        x, y = data.get_batch()
        nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
        opt.step()
    for (x,) in valid_loader:
        model(x.cuda())


if __name__ == "__main__":
    train(None, 1)
"""


def test_training_data_that_nothing_shards_gets_a_note():
    """clovaai/deep-text-recognition-benchmark: the training batches come from the
    dataset's own get_batch(), the only DataLoader validates: nothing is sharded,
    and the report says so (it kept quiet: "a DataLoader exists")."""
    (note,) = _entry_notes({"train.py": TRAIN_FROM_ELSEWHERE})
    assert "no DataLoader here feeds training" in note
    no_loader = TRAIN_FROM_ELSEWHERE.replace(b"DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)", b"[]")
    (note,) = _entry_notes({"train.py": no_loader})
    assert note.startswith("no DataLoader in this program")
    # a training loader that gets its sampler: no such note
    sharded = TRAIN_FROM_ELSEWHERE.replace(b"valid_loader = ", b"train_loader = ").replace(
        b"in valid_loader", b"in train_loader"
    )
    assert _entry_notes({"train.py": sharded}) == []


def test_a_training_script_whose_data_comes_from_outside_is_not_skipped_silently():
    """Walking a folder, a script that trains but builds no DataLoader and uses no
    DataParallel (its loaders come from an installed package) is not converted --
    it said "0 files would be converted" and nothing else; named, it converts."""
    script = TRAIN_FROM_ELSEWHERE.replace(
        b"    valid_loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)\n", b""
    ).replace(b"nn.DataParallel(nn.Linear(4, 2))", b"nn.Linear(4, 2)").replace(
        b"    for (x,) in valid_loader:\n        model(x.cuda())\n", b""
    ).replace(b"from torch.utils.data import DataLoader, TensorDataset\n", b"from mylib.data import loaders\n")
    (walked,) = convert_sources({"train.py": script}, explicit=set()).files
    assert not walked.changed
    assert [(f.code, f.kind) for f in walked.findings] == [("DDP002", "note")]
    assert "name it on the command line" in walked.findings[0].message
    (named,) = convert_sources({"train.py": script}, explicit={"train.py"}).files
    assert named.changed and not any("name it on the command line" in f.message for f in named.findings)


def test_non_utf8_and_non_python_files_get_a_clear_error(tmp_path):
    (tmp_path / "binary.py").write_bytes(b"import torch\n\x00\x01\x02\xff\xfe")
    (tmp_path / "latin.py").write_bytes("import torch\nx = 'é'\n".encode("latin-1"))
    (tmp_path / "good.py").write_text(DP)
    result = convert("--write", tmp_path)
    assert result.exit_code == 1
    assert f"{tmp_path / 'binary.py'}:" in result.stderr
    assert f"{tmp_path / 'latin.py'}:2:6: cannot decode (utf-8)" in result.stderr  # the byte's line and column
    assert (tmp_path / "binary.py").read_bytes() == b"import torch\n\x00\x01\x02\xff\xfe"
    assert "DistributedDataParallel(" in (tmp_path / "good.py").read_text()


# ------------------------------------------------------------------ writes
def test_permissions_are_kept(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(DP)
    path.chmod(0o750)
    assert convert("--write", path).exit_code == 0
    assert (path.stat().st_mode & 0o777) == 0o750
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_read_only_files_are_not_replaced(tmp_path):
    # a rename needs only the folder's permission: the file's own must be asked
    locked, other = tmp_path / "locked" / "train.py", tmp_path / "other" / "train.py"
    for path in (locked, other):
        path.parent.mkdir()
        path.write_text(DP)
    locked.chmod(0o444)
    result = convert("--write", tmp_path)
    assert result.exit_code == 1
    assert f"{locked}: read-only file, not rewritten" in result.stderr
    assert locked.read_text() == DP and (locked.stat().st_mode & 0o777) == 0o444
    assert "DistributedDataParallel(" in other.read_text()
    # lint --fix, too
    fixed = CliRunner().invoke(cli, ["lint", "--no-config", "--fix", str(locked)])
    assert "read-only file, not rewritten" in fixed.stderr and fixed.exit_code == 1
    assert locked.read_text() == DP


def test_write_failure_leaves_the_file_and_reports_it(tmp_path, monkeypatch):
    import tempfile

    path = tmp_path / "train.py"
    path.write_text(DP)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    result = convert("--write", path)
    assert result.exit_code == 1
    assert "cannot write" in result.stderr and "Permission denied" in result.stderr
    assert path.read_text() == DP


def test_unreadable_file_is_reported_and_others_converted(tmp_path, monkeypatch):
    bad, good = tmp_path / "a.py", tmp_path / "b.py"
    bad.write_text(DP)
    good.write_text(DP)
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "a.py":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = convert("--write", tmp_path)
    assert result.exit_code == 1
    assert "a.py:1:1: cannot read: Permission denied" in result.stderr
    assert "DistributedDataParallel(" in good.read_text()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_lint_reports_a_file_it_cannot_read_and_lints_the_others(tmp_path, monkeypatch, jobs):
    """Files are read when they are linted (not all at once first): one that
    cannot be read then, or that vanished after it was found, is an error
    naming it, and the rest of the run goes on (in-process and with workers)."""
    from dp2ddp import runner

    for n in range(70):  # enough for the worker pool
        (tmp_path / f"m{n:02d}.py").write_text(DP)
    real = Path.read_bytes
    found = runner.discover

    def read_bytes(self):
        if self.name == "m03.py":
            raise PermissionError(13, "Permission denied")
        return real(self)

    def discover(*args, **kwargs):
        files, skipped = found(*args, **kwargs)
        (tmp_path / "m05.py").unlink()  # gone between the walk and the read
        return files, skipped

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(runner, "discover", discover)
    result = CliRunner().invoke(cli, ["lint", "--no-cache", "--no-config", "-j", jobs, str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "m03.py: cannot read: Permission denied" in result.stderr
    assert "m05.py: cannot read" in result.stderr
    assert sum(f"m{n:02d}.py:" in result.stdout for n in range(70)) == 68


@pytest.mark.parametrize("args", [["--fix"], ["--format", "json"], ["--format", "sarif"], ["--format", "json", "--fix-edits"]])
def test_lint_fix_and_reports_go_on_past_an_unreadable_file(tmp_path, monkeypatch, args):
    """A file that cannot be read when linted is reported once and left out of
    what follows (the fix, the fix edits of a JSON/SARIF report)."""
    (tmp_path / "a.py").write_text(DP)
    (tmp_path / "b.py").write_text(DP)
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "b.py":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = CliRunner().invoke(cli, ["lint", "--no-cache", "--no-config", "-j", "1", *args, str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert result.stderr.count("b.py: cannot read: Permission denied") == 1
    if args == ["--fix"]:
        assert "Fixed 1 file" in result.stdout
        assert "DistributedDataParallel(" in (tmp_path / "a.py").read_text()
    else:
        assert "a.py" in result.stdout and "DDP001" in result.stdout


def test_lint_fix_does_not_overwrite_a_file_edited_while_it_was_fixed(tmp_path, monkeypatch):
    from dp2ddp import lint

    path = tmp_path / "train.py"
    path.write_text(DP)
    real = lint.fix_sources

    def fix_then_edit(*args, **kwargs):
        fixed = real(*args, **kwargs)
        path.write_text(DP + "\n# edited meanwhile\n")
        return fixed

    monkeypatch.setattr(lint, "fix_sources", fix_then_edit)
    result = CliRunner().invoke(cli, ["lint", "--no-cache", "--no-config", "--fix", str(path)])
    assert result.exit_code == 1
    assert "changed on disk since it was read" in result.stderr
    assert path.read_text().endswith("# edited meanwhile\n")


def test_file_changed_on_disk_during_the_run_is_not_overwritten(tmp_path, monkeypatch):
    from dp2ddp import runner

    path = tmp_path / "train.py"
    path.write_text(DP)
    real = runner.ConvertRun.convert

    def convert_then_edit(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        path.write_text(DP + "\n# edited meanwhile\n")
        return result

    monkeypatch.setattr(runner.ConvertRun, "convert", convert_then_edit)
    result = convert("--write", path)
    assert result.exit_code == 1
    assert "changed on disk since it was read" in result.stderr and "re-run" in result.stderr
    assert path.read_text().endswith("# edited meanwhile\n")


def test_interrupted_write_leaves_every_file_old_or_new(tmp_path, monkeypatch):
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text(DP)
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    result = convert("--write", tmp_path)
    assert result.exit_code == 130
    contents = [(tmp_path / n).read_text() for n in ("a.py", "b.py", "c.py")]
    assert sum("DistributedDataParallel(" in c for c in contents) == 1
    assert sum(c == DP for c in contents) == 2
    assert not [p for p in tmp_path.iterdir() if ".dp2ddp.tmp" in p.name]


# ------------------------------------------------------------------ paths
def test_symlinks_out_of_the_tree_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    tree = tmp_path / "tree"
    outside.mkdir()
    tree.mkdir()
    (outside / "secret.py").write_text(DP)
    (tree / "link.py").symlink_to(outside / "secret.py")
    (tree / "linkdir").symlink_to(outside, target_is_directory=True)
    (tree / "train.py").write_text(DP)
    result = convert("--write", tree)
    assert result.exit_code == 0, result.output
    assert (outside / "secret.py").read_text() == DP
    assert "DistributedDataParallel(" in (tree / "train.py").read_text()


def test_include_and_exclude(tmp_path):
    for name in ("keep.py", "skip_me.py"):
        (tmp_path / name).write_text(DP)
    result = convert("--check", "--exclude", "skip_*.py", tmp_path)
    assert "1 file would be converted" in result.stderr
    result = convert("--check", "--include", "skip_*.py", tmp_path)
    assert "1 file would be converted" in result.stderr


def test_include_takes_folders_skipped_by_default(tmp_path):
    """build/, hidden and gitignored folders are skipped, unless --include names
    them or something in them."""
    (tmp_path / ".gitignore").write_text("legacy/\n")
    for folder in ("build", ".hidden", "legacy"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.py").write_text(DP)
    assert "0 files would be converted" in convert("--check", tmp_path).stderr
    for pattern in ("build/*", "build/train.py", ".hidden/*", "legacy/*"):
        result = convert("--check", "--include", pattern, tmp_path)
        assert "1 file would be converted" in result.stderr, (pattern, result.stderr)
    # a wildcard names none of them: only the folders walked anyway match
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "train.py").write_text(DP)
    for pattern in ("*/train.py", "**/train.py"):
        result = convert("--check", "--include", pattern, tmp_path)
        assert "1 file would be converted" in result.stderr, (pattern, result.stderr)


# ------------------------------------------------------------------ git
def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "train.py").write_text(DP)
    _git(tmp_path, "add", "train.py")
    _git(tmp_path, "commit", "-qm", "init")
    return tmp_path


def test_dirty_git_tree_is_refused_unless_allowed(repo):
    (repo / "train.py").write_text(DP + "\n# my own uncommitted edit\n")
    result = convert("--write", repo)
    assert result.exit_code == 1
    assert "uncommitted changes" in result.stderr and "--allow-dirty" in result.stderr
    assert "train.py" in result.stderr
    assert (repo / "train.py").read_text().endswith("# my own uncommitted edit\n")
    result = convert("--write", "--allow-dirty", repo)
    assert result.exit_code == 0
    assert "DistributedDataParallel(" in (repo / "train.py").read_text()


def test_clean_git_tree_and_no_git_work_as_usual(repo, tmp_path_factory):
    assert convert("--write", repo).exit_code == 0
    plain = tmp_path_factory.mktemp("nogit")
    (plain / "train.py").write_text(DP)
    assert convert("--write", plain).exit_code == 0


# ------------------------------------------------------------------ properties
_IMPORTS = {
    "torch.nn.DataParallel": ("import torch\n", "torch.nn.DataParallel"),
    "nn.DataParallel": ("import torch\nimport torch.nn as nn\n", "nn.DataParallel"),
    "nn.parallel.DataParallel": ("import torch\nfrom torch import nn\n", "nn.parallel.DataParallel"),
    "from torch.nn": ("import torch\nfrom torch.nn import DataParallel\n", "DataParallel"),
    "as DP": ("import torch\nfrom torch.nn.parallel import DataParallel as DP\n", "DP"),
}
_COMMENTS = ["", "  # wrap it", "  # noqa", "  # type: ignore"]


@st.composite
def scripts(draw):
    head, dp = _IMPORTS[draw(st.sampled_from(sorted(_IMPORTS)))]
    comment = draw(st.sampled_from(_COMMENTS))
    chain = draw(st.sampled_from(["", ".cuda()", ".to(device)"]))
    guard = draw(st.booleans())
    nesting = draw(st.sampled_from(["function", "method", "main", "module"]))
    loader = draw(st.booleans())
    shuffle = draw(st.sampled_from(["", ", shuffle=True", ", shuffle=False"]))
    wrap = f"model = {dp}(model){chain}{comment}\n"
    if guard:
        wrap = f"if torch.cuda.device_count() > 1:{comment}\n    {wrap}"
    body = [
        "# leading comment\n",
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "model = torch.nn.Linear(4, 2).to(device)\n",
        wrap,
    ]
    if loader:
        body += [
            "from torch.utils.data import DataLoader\n",
            f"train_loader = DataLoader(list(range(16)), batch_size=4{shuffle})  # data\n",
            "for epoch in range(2):\n",
            "    for batch in train_loader:\n",
            "        pass\n",
        ]
    body += ["print('done')\n", "torch.save(model.state_dict(), 'm.pt')\n"]
    text = "".join(body)
    indent = lambda t, n: "".join((" " * n + line if line.strip() else line) for line in t.splitlines(True))
    if nesting == "function":
        code = head + "\n\ndef build():\n" + indent(text, 4) + "    return model\n"
    elif nesting == "method":
        code = head + "\n\nclass Trainer:\n    def build(self):\n" + indent(text, 8) + "        return model\n"
    elif nesting == "main":
        code = head + "\nif __name__ == '__main__':\n" + indent(text, 4)
    else:
        code = head + text
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "crlf"]))
    if encoding == "crlf":
        return code.replace("\n", "\r\n").encode()
    return code.encode(encoding)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
def test_generated_scripts_convert_to_valid_idempotent_code(data):
    (file,) = convert_sources({"script.py": data}).files
    assert file.error is None, file.error
    out = file.output if file.output is not None else data
    compile(out, "script.py", "exec")
    # the wrap, however DataParallel was spelled (``DP(model)`` too), is DDP now, or
    # left with its reason: a DDP001 marker right above it, or -- a script that does
    # not train, left as it was (one process, as before) -- a DDP001 note: never in silence
    spelled = re.search(rb"model = ([\w.]+)\(model\)", data).group(1)
    lines = out.splitlines()
    left = [i for i, line in enumerate(lines) if spelled + b"(model)" in line and not line.lstrip().startswith(b"#")]
    assert left or b"DistributedDataParallel(" in out, out.decode()
    noted = out == data and any(f.code == "DDP001" and f.kind == "note" for f in file.findings)
    assert noted or all(lines[i - 1].lstrip().startswith(b"# dp2ddp: DDP001") for i in left), out.decode()
    if data.startswith(b"\xef\xbb\xbf"):
        assert out.startswith(b"\xef\xbb\xbf")
    if b"\r\n" in data:
        assert out.count(b"\r\n") == out.count(b"\n")
    (again,) = convert_sources({"script.py": out}).files
    assert again.error is None and (again.output is None or again.output == out)


def test_a_folder_given_by_name_is_walked_even_if_gitignored_above(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("vendor/\n*.generated.py\n")
    inner = tmp_path / "vendor" / "pkg"
    inner.mkdir(parents=True)
    (inner / "train.py").write_text(DP)
    (inner / "x.generated.py").write_text(DP)
    result = convert("--check", inner)
    assert "1 file would be converted" in result.stderr  # the folder, minus what is ignored inside


# ------------------------------------------------------------------ odd paths and odd files
def test_symlink_loops_links_inside_the_tree_and_fifos(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "train.py").write_text(DP)
    os.symlink("a.py", tree / "b.py")  # a loop
    os.symlink("b.py", tree / "a.py")
    os.symlink("../train.py", tree / "sub" / "alias.py")  # the same file under a second name
    os.mkfifo(tree / "pipe.py")  # reading it would block forever
    result = convert("--write", str(tree))
    assert result.exit_code == 0, result.output
    assert "1 file converted" in result.stderr
    assert "b.py: symbolic link that cannot be resolved" in result.stderr
    assert "pipe.py: not a regular file" in result.stderr
    assert os.path.islink(tree / "sub" / "alias.py")
    lint = CliRunner().invoke(cli, ["lint", "--no-cache", "--no-config", str(tree)])
    assert lint.exit_code == 0, lint.output  # converted once, nothing stale


def test_a_nested_gitignore_can_unignore(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("*.py\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").write_text("!*.py\n")
    (tmp_path / "sub" / "train.py").write_text(DP)
    (tmp_path / "ignored.py").write_text(DP)
    result = convert(str(tmp_path))  # the diff
    assert "sub/train.py" in result.stdout and "ignored.py" not in result.stdout


def test_deep_nesting_and_a_form_feed_are_left_alone_without_an_internal_error(tmp_path):
    deep = tmp_path / "deep.py"
    deep.write_text("import torch\nx = " + "abs(" * 150 + "torch.zeros(1).cuda()" + ")" * 150 + "\n")
    feed = tmp_path / "feed.py"  # LibCST drops this form feed: a file it cannot give back
    feed.write_bytes(b"import torch\nimport torch.nn as nn\n\x0cdef f(x):\n    return nn.DataParallel(x)\n")
    calm = tmp_path / "calm.py"  # the same, with nothing to change: not touched at all
    calm.write_bytes(b"import torch\n\x0cdef f(x):\n    return torch.relu(x)\n")
    before = {p: p.read_bytes() for p in (deep, feed, calm)}
    result = convert("--write", deep, feed, calm)  # named: each is part of the conversion
    assert result.exit_code == 1  # one file could not be converted, one is incomplete
    # the statement too deep for LibCST holds a .cuda(): kept as written, left for a human
    assert "deep.py:2:1: DDP900 too deeply nested for LibCST" in result.output, result.output
    assert "convert it by hand" in result.output and "1 incomplete" in result.output
    assert "feed.py:3:1: LibCST cannot reproduce this file byte for byte" in result.stderr
    assert "internal error" not in result.output
    assert {p: p.read_bytes() for p in before} == before


def test_a_long_expression_cpython_compiles_is_held_back_and_the_rest_converted(tmp_path):
    """A 2,500-term sum (CPython compiles it; LibCST's recursion runs out) is named
    at its line and kept as written; the rest of the file is converted (it was left
    unchanged whole), and the result trains on two ranks under torchrun."""
    from conftest import run_script

    deep_sum = "    x = (" + " + ".join(["y"] * 2500) + ")\n"
    source = (
        "import torch\nimport torch.nn as nn\n\n\ndef f(y):\n" + deep_sum + "    return x\n\n\n"
        "def main():\n    model = nn.DataParallel(nn.Linear(4, 2))\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 / f(1) * 2500)\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 2))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            optimizer.zero_grad()\n"
        "            torch.nn.functional.mse_loss(model(x), y).backward()\n            optimizer.step()\n"
        "    torch.save(model.state_dict(), 'model.pt')\n\n\nif __name__ == '__main__':\n    main()\n"
    )
    compile(source, "deep.py", "exec")
    deep = tmp_path / "deep.py"
    deep.write_text(source)
    result = convert(deep)  # the diff: lines of the file as written
    assert result.exit_code == 0, result.output
    assert f"{deep}:6:5: DDP900 too deeply nested for LibCST" in result.output, result.output
    assert convert("--write", deep).exit_code == 0
    converted = deep.read_text()
    assert deep_sum in converted and "DistributedDataParallel(" in converted and "DistributedSampler(" in converted
    assert convert("--check", deep).exit_code == 0  # (a fixed point)
    run = run_script(tmp_path, "deep.py", [], True)
    assert run.returncode == 0, run.output[-3000:]
    assert run.ranks_in_sync() is None and run.training_sharded() is None


def test_one_line_forms_are_converted_and_the_result_runs_under_torchrun(tmp_path):
    """``if __name__ == "__main__": main()``, a one-line epoch loop, ``save(...); print(...)``
    (they crashed the conversion, or were left on every rank): spelled out where the
    conversion changes them, and the converted script trains on two ranks."""
    from conftest import run_script

    source = (FIXTURES / "process-group-setup" / "one_line_forms.in.py").read_bytes()
    (file,) = convert_sources({"train.py": source}).files
    assert file.error is None and file.changed, file.error
    output = file.output.decode()
    assert "    a = 1; b = 2  # unrelated: kept on one line\n" in output
    assert "torch.cuda.set_device(0)" not in output and "pass\n" not in output
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_bytes(file.output)
    run = run_script(work, "train.py", [], distributed=True)
    assert run.returncode == 0, run.output
    assert run.output.count("final loss") == 1 and run.output.count("saved") == 1, run.output
    assert run.writers_of(work / "one_line.pt") == ["0"], run.writes


def test_a_file_with_cr_only_line_endings_is_left_unchanged_with_the_reason():
    source = b"import torch\rimport torch.nn as nn\rmodel = nn.DataParallel(nn.Linear(2, 2))\r"
    (file,) = convert_sources({"old_mac.py": source}).files
    assert file.output is None and "CR alone (old Mac OS line endings)" in file.error


def test_a_conversion_that_is_not_a_fixed_point_is_refused_before_writing(tmp_path, monkeypatch):
    """The last check before writing: converting the output again must change
    nothing (and it must parse); a transform that breaks that is a bug in dp2ddp,
    reported, and the file stays as it was."""
    import libcst as cst

    from dp2ddp import codemods
    from dp2ddp.codemods._base import Transform

    class AppendsEveryTime(Transform):
        NAME = "appends-every-time"

        def leave_Module(self, original_node, updated_node):
            self.changed(original_node, "one more line")
            return updated_node.with_changes(body=[*updated_node.body, cst.parse_statement("x = 1")])

    monkeypatch.setattr(codemods, "TRANSFORMS", (AppendsEveryTime,))
    script = tmp_path / "train.py"
    source = (FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py").read_bytes()
    script.write_bytes(source)
    result = CliRunner().invoke(cli, ["convert", "--write", "-j", "1", str(script)], catch_exceptions=False)
    assert result.exit_code == 123, result.output
    assert "not idempotent" in result.output and "+x = 1" in result.output
    assert script.read_bytes() == source
    # the diff mode (no write) shows the change: the check guards writes
    shown = CliRunner().invoke(cli, ["convert", "-j", "1", str(script)], catch_exceptions=False)
    assert "+x = 1" in shown.output
    # (and what it leaves -- the DataParallel, which no transform of this test converts -- is said)
    assert shown.exit_code == 1 and "DDP001 the converted program still has this" in shown.output


ONE_LINERS = b'''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

VERBOSE = True
if VERBOSE:
    print("starting")
    print("really")


def main():
    model = nn.DataParallel(nn.Linear(4, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1)); loader = DataLoader(data, batch_size=8, shuffle=True)
    if VERBOSE: print("starting")
    for epoch in range(2):
        if epoch > 5: opt.param_groups[0]["lr"] *= 0.1  # step decay

        for x, y in loader:
            opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
        if epoch > 5: opt.param_groups[0]["lr"] *= 0.1  # step decay


def schedule(flag):
    if flag == 1:
        epochs = 3
    elif flag == 2: epochs = 4
    else: epochs = 5
    match flag:
        case 1: epochs = 6
    return epochs


if __name__ == "__main__": main()
'''


def test_one_line_forms_are_put_back_where_they_were_and_findings_keep_their_lines():
    """Only what was spelled out is put back (an identical block elsewhere is not
    touched), every unchanged one-liner is put back, and findings name the lines of
    the file as written."""
    (file,) = convert_sources({"script.py": ONE_LINERS}).files
    assert file.error is None, file.error
    out = file.output.decode()
    assert 'if VERBOSE:\n    print("starting")\n    print("really")\n' in out  # the module's block, as it was
    assert '    if VERBOSE:\n        if dist.get_rank() == 0:\n            print("starting")\n' in out
    assert out.count('        if epoch > 5: opt.param_groups[0]["lr"] *= 0.1  # step decay\n') == 2
    assert "            opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()\n" in out
    assert "dp2ddp-spelled" not in out
    assert "    elif flag == 2: epochs = 4\n    else: epochs = 5\n" in out and "        case 1: epochs = 6\n" in out
    lines = {(f.code, f.line) for f in file.findings}
    assert ("DDP001", 12) in lines and ("DDP101", 13) in lines and ("DDP301", 14) in lines, sorted(lines)
    # and columns: the DataLoader after `data = ...; ` on line 13
    (loader,) = {(f.line, f.column) for f in file.findings if f.code == "DDP101" and f.kind == "change"}
    assert loader == (13, ONE_LINERS.splitlines()[12].index(b"DataLoader(") + 1)
    (again,) = convert_sources({"script.py": file.output}).files
    assert again.output in (None, file.output)


def test_the_respelling_mark_changes_nothing_the_transforms_decide():
    """The mark on a spelled-out one-liner is invisible to the conversion: a user's
    one-line function is not taken for dp2ddp's helper, an emptied one-line check
    goes like a two-line one, the mark takes no room in black's line length, and
    text of the user's that looks like a mark is kept."""
    source = b'''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

s = "keep  # dp2ddp-spelled:0 this"


def per_rank_batch_size(n): return n * 2


def main():
    if torch.cuda.is_available(): torch.cuda.set_device(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=per_rank_batch_size(8), shuffle=True)
    model = nn.DataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = torch.randn(64, 4).cuda(), torch.randn(64, 1).cuda(); print(inputs.shape)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
'''
    (file,) = convert_sources({"script.py": source}).files
    assert file.error is None, file.error
    out = file.output.decode()
    assert "batch_size=dp2ddp_per_rank_batch_size(per_rank_batch_size(8))" in out
    assert "set_device(0)" not in out and "pass\n" not in out
    assert "    inputs, targets = torch.randn(64, 4).to(device), torch.randn(64, 1).to(device)\n" in out
    assert 's = "keep  # dp2ddp-spelled:0 this"\n' in out
    assert "def per_rank_batch_size(n): return n * 2\n" in out


def _lint(*args, cwd=None):
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(cli, ["lint", "--no-config", *map(str, args)], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_links_named_on_the_command_line_that_loop_or_dangle_are_errors(tmp_path):
    (tmp_path / "loop.py").symlink_to("loop.py")
    (tmp_path / "dangling.py").symlink_to("missing.py")
    for name, why in (("loop.py", "a symbolic link that loops"), ("dangling.py", "no such file or directory")):
        for run in (_lint, convert):
            result = run(name, cwd=tmp_path)
            assert result.exit_code == 2, (name, run, result.output)  # a usage error, as a missing path
            assert f"{name}: {why}" in result.output
            assert "internal error" not in result.output


def test_a_link_named_on_the_command_line_to_a_file_outside_the_tree_is_not_taken(tmp_path):
    outside = tmp_path / "elsewhere" / "train.py"
    outside.parent.mkdir()
    outside.write_text(DP)
    project = tmp_path / "project"
    project.mkdir()
    (project / "link.py").symlink_to(outside)
    (project / "inside.py").write_text(DP)
    (project / "inner.py").symlink_to(project / "inside.py")  # (a link within the tree: taken)
    result = convert("--write", "link.py", "inner.py", cwd=project)
    assert f"skipped link.py: a symbolic link to {outside}, outside {project}" in result.stderr
    assert outside.read_text() == DP  # not rewritten through the link
    assert (project / "inside.py").read_text() != DP
    lint = _lint("link.py", cwd=project)
    assert f"skipped link.py: a symbolic link to {outside}" in lint.stderr


def test_a_random_binary_py_gets_one_verdict_from_convert_and_lint(tmp_path):
    import random

    rng = random.Random(3)
    noise = bytes(rng.randrange(256) for _ in range(3000))
    assert b"torch" not in noise and b"DataParallel" not in noise and b"__main__" not in noise
    (tmp_path / "noise.py").write_bytes(noise)
    converted, linted = convert("--check", "noise.py", cwd=tmp_path), _lint("noise.py", cwd=tmp_path)
    # out of scope for both (it never mentions torch), as a text file without torch is
    assert converted.exit_code == 0 and "1 left unchanged" in converted.stderr
    assert linted.exit_code == 0 and "DDP900" not in linted.output
    # with torch in it, both report that it does not decode
    (tmp_path / "noise.py").write_bytes(b"import torch\n" + noise)
    converted, linted = convert("--check", "noise.py", cwd=tmp_path), _lint("noise.py", cwd=tmp_path)
    assert converted.exit_code == 1 and "noise.py:" in converted.stderr and "cannot decode" in converted.stderr
    assert linted.exit_code == 1 and "DDP900 cannot decode" in linted.output
