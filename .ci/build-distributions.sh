#!/usr/bin/env bash
# Build the repository's three distributions (speculative-llm, langchain-speculative,
# llama-index-llms-speculative; an sdist each and a wheel built from it), install the wheels
# into a fresh virtual environment (the core without extras: httpx, pydantic and the two
# frameworks come from pip's cache) and run a LangChain chain and a LlamaIndex call with
# them against a small local OpenAI-compatible server (.ci/smoke_distributions.py).
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for project in . integrations/langchain-speculative integrations/llama-index-llms-speculative; do
  # --no-isolation: hatchling is in the dev extra, so no build environment per project.
  python -m build --no-isolation --outdir "$work/dist" "$project" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
done
ls -l "$work/dist"

# No pip of its own (ensurepip costs seconds): this environment's pip installs into it.
python -m venv --without-pip "$work/venv"
python -m pip --python "$work/venv/bin/python" install -q --disable-pip-version-check \
  "$work"/dist/*.whl
# Isolated mode, from outside the checkout: only the installed wheels can be imported.
cd "$work"
"$work/venv/bin/python" -I "$checkout/.ci/smoke_distributions.py"
