#!/usr/bin/env bash
# The [local] extra in a fresh virtual environment with an empty pip cache: llama.cpp compiled.
set -uo pipefail
ROOT=/tmp/install-measure
REPO=/work/main
rm -rf /tmp/lean-cold $ROOT/pip-cache-cold
mkdir -p $ROOT/pip-cache-cold
echo "== load at start $(cut -d' ' -f1-3 /proc/loadavg); $(lscpu | grep 'Model name'); nproc $(nproc)"
python3 -m venv /tmp/lean-cold
start=$(date +%s)
(while sleep 30; do cut -d' ' -f1 /proc/loadavg; done) > $ROOT/cold-load.txt &
sampler=$!
PIP_CACHE_DIR=$ROOT/pip-cache-cold CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_PROJECT_INCLUDE=$REPO/.ci/llama-cpp-targets.cmake" LLAMA_CPP_BUILD_JOBS=$(nproc) \
  /usr/bin/time -f "== elapsed %e s, user %U s, system %S s, CPU %P" /tmp/lean-cold/bin/pip install "$REPO[local]" > $ROOT/cold-pip.out 2>&1
rc=$?
kill $sampler
tail -2 $ROOT/cold-pip.out
grep "Building wheel for\|Created wheel" $ROOT/cold-pip.out | head
echo "== rc=$rc wall $(( $(date +%s) - start )) s; load at end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== load average (1 min) every 30 s: $(tr '\n' ' ' < $ROOT/cold-load.txt)"
echo "== du -sh /tmp/lean-cold: $(du -sh /tmp/lean-cold | cut -f1)"
