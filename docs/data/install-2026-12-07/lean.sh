#!/usr/bin/env bash
# The [local] extra in a fresh virtual environment, pip's wheel cache warm (llama.cpp's wheels cached).
set -uo pipefail
ROOT=/tmp/install-measure
REPO=/work/main
rm -rf /tmp/lean
echo "== load at start $(cut -d' ' -f1-3 /proc/loadavg); $(lscpu | grep 'Model name'); nproc $(nproc)"
python3 -m venv /tmp/lean
/tmp/lean/bin/pip --version
start=$(date +%s)
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_PROJECT_INCLUDE=$REPO/.ci/llama-cpp-targets.cmake" LLAMA_CPP_BUILD_JOBS=$(nproc) \
  /usr/bin/time -f "== elapsed %e s, user %U s, system %S s, CPU %P" /tmp/lean/bin/pip install "$REPO[local]" > $ROOT/lean-pip.out 2>&1
rc=$?
tail -2 $ROOT/lean-pip.out
grep "Building wheel\|Using cached llama\|Created wheel" $ROOT/lean-pip.out | head
echo "== rc=$rc wall $(( $(date +%s) - start )) s; load at end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== du -sh /tmp/lean: $(du -sh /tmp/lean | cut -f1)"
/tmp/lean/bin/pip list --format=freeze > $ROOT/lean-freeze.txt
/tmp/lean/bin/python -c "import importlib.util as u; print('== torch importable:', u.find_spec('torch') is not None, '; xgrammar:', u.find_spec('xgrammar') is not None)"
