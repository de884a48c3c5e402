#!/usr/bin/env bash
# dp2ddp's GPU path, on a machine with CUDA: converts the e2e fixtures
# (fixtures/e2e/*/before), runs `dp2ddp verify` on each converted entry point with
# NCCL (one rank per visible GPU: a world of one on a single GPU), requires check 9
# (each rank's device is its LOCAL_RANK) to pass, not to be skipped, and verifies
# the AMP fixture (fixtures/verify/amp_train.py). One verdict line per fixture.
#
#     bash benchmarks/gpu_check.sh
#
# Installs into $GPU_CHECK_VENV (default .venv-gpu, reused when present) torch
# $TORCH_VERSION (default 2.13.0) from the package registry ($TORCH_INDEX_URL if
# set) and the project.  Without CUDA it prints "skipped: no CUDA" and exits 0.
# Exit 1 when a fixture is not verified.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_check: skipped: no CUDA (nvidia-smi lists no GPU)"
    exit 0
fi

started=$(date +%s)
VENV="${GPU_CHECK_VENV:-$ROOT/.venv-gpu}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || exit 1
fi
PY="$VENV/bin/python"
index=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then index=(--index-url "$TORCH_INDEX_URL"); fi
"$PY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" "${index[@]}" || exit 1
"$PY" -m pip install -q -e "$ROOT" || exit 1

gpus=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "${gpus:-0}" = "0" ]; then
    echo "gpu_check: skipped: no CUDA (torch $("$PY" -c 'import torch; print(torch.__version__)') sees no GPU)"
    exit 0
fi
echo "gpu_check: $gpus GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}), installs $(( $(date +%s) - started )) s"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0

# verdict NAME DIR ENTRY ARGS...: verify ENTRY in DIR and print one line
verdict() {
    local name="$1" dir="$2" entry="$3"
    shift 3
    local t0 json line
    t0=$(date +%s)
    json="$work/$name.json"
    (cd "$dir" && "$PY" -m dp2ddp verify --nproc-per-node "$gpus" --timeout 120 --format json "$entry" -- "$@") \
        >"$json" 2>"$work/$name.err"
    line=$("$PY" - "$json" "$name" "$(( $(date +%s) - t0 ))" <<'PYEOF'
import json, sys
path, name, seconds = sys.argv[1:]
try:
    report = json.load(open(path))
except (OSError, ValueError):
    print(f"{name}: ERROR (no report; see its stderr)"); sys.exit(1)
checks = {c["id"]: c for c in report["checks"]}
device = checks.get(9, {})
backend = ", ".join(checks.get(1, {}).get("details", {}).get("backend", [])) or "?"
bad = [f'{c["id"]} {c["status"]}: {c["message"]}' for c in report["checks"] if c["status"] not in ("pass", "skip")]
if device.get("status") != "pass":
    bad.append(f'9 {device.get("status")}: {device.get("message")} (a GPU run must call set_device per LOCAL_RANK)')
if backend != "nccl":
    bad.append(f"backend {backend}, not nccl")
verdict = "OK" if not bad else "FAILED"
print(f"{name}: {verdict} ({report['world_size']} rank(s), {backend}, {seconds} s)" + ("" if not bad else " -- " + "; ".join(bad)))
sys.exit(0 if not bad else 1)
PYEOF
) || failed=1
    echo "$line"
}

for case in "$ROOT"/fixtures/e2e/*/; do
    name=$(basename "$case")
    cp -r "$case/before" "$work/$name"
    if ! "$PY" -m dp2ddp convert --write --allow-dirty "$work/$name" >"$work/$name.convert" 2>&1; then
        echo "$name: FAILED (convert: $(tail -1 "$work/$name.convert"))"
        failed=1
        continue
    fi
    mapfile -t args < <("$PY" -c "import json, sys; [print(a) for a in json.load(open(sys.argv[1]))['args']]" "$case/case.json")
    entry=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['entry'])" "$case/case.json")
    verdict "$name" "$work/$name" "$entry" "${args[@]}"
done
mkdir -p "$work/amp" && cp "$ROOT/fixtures/verify/amp_train.py" "$work/amp/"
verdict amp_train "$work/amp" amp_train.py

echo "gpu_check: $([ $failed = 0 ] && echo OK || echo FAILED) in $(( $(date +%s) - started )) s"
exit $failed
