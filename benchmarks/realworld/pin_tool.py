"""Make a frozen copy of dp2ddp at one commit, for score.py --tool (the working tree of
the project may be mid-edit):  python pin_tool.py REPO COMMIT OUT

OUT/pkg holds the installed layout (dp2ddp/ with codemods/ as dp2ddp/codemods) and
OUT/shim a sitecustomize that drops the editable install's import hook, so that
PYTHONPATH=OUT/shim:OUT/pkg imports this copy only."""
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

repo, commit, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
data = subprocess.run(["git", "-C", repo, "archive", commit, "dp2ddp", "codemods"],
                      check=True, capture_output=True).stdout
if out.exists():
    shutil.rmtree(out)
(out / "pkg").mkdir(parents=True)
tarfile.open(fileobj=io.BytesIO(data)).extractall(out / "pkg")
shutil.move(str(out / "pkg" / "codemods"), str(out / "pkg" / "dp2ddp" / "codemods"))
(out / "shim").mkdir()
(out / "shim" / "sitecustomize.py").write_text(
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path\n"
    "                    if 'editable' not in getattr(f, '__module__', type(f).__module__)]\n")
(out / "COMMIT").write_text(subprocess.run(["git", "-C", repo, "rev-parse", commit], check=True,
                                           capture_output=True, text=True).stdout)
print(out)
