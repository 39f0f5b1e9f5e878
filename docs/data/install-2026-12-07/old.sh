#!/usr/bin/env bash
# The old [local] extra (commit 90f97db8e06188c78c7b5379bcc2ee81f1891c7b, before torch left it), fresh venv, warm pip cache.
set -uo pipefail
ROOT=/tmp/install-measure
rm -rf /tmp/oldlocal
echo "== load at start $(cut -d' ' -f1-3 /proc/loadavg)"
python3 -m venv /tmp/oldlocal
start=$(date +%s)
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_PROJECT_INCLUDE=/tmp/oldrepo/.ci/llama-cpp-targets.cmake" LLAMA_CPP_BUILD_JOBS=$(nproc) \
  /usr/bin/time -f "== elapsed %e s, user %U s, system %S s, CPU %P" /tmp/oldlocal/bin/pip install --find-links /opt/wheels torch==2.13.0 "/tmp/oldrepo[local]" > $ROOT/old-pip.out 2>&1
rc=$?
tail -2 $ROOT/old-pip.out
echo "== rc=$rc wall $(( $(date +%s) - start )) s; load at end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== du -sh /tmp/oldlocal: $(du -sh /tmp/oldlocal | cut -f1)"
du -sh /tmp/oldlocal/lib/python3.11/site-packages/{torch,triton,transformers,xgrammar,nvidia} 2>/dev/null
/tmp/oldlocal/bin/pip list --format=freeze > $ROOT/old-freeze.txt
