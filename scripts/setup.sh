#!/usr/bin/env bash
# Creates .venv and installs tandem into it. Usage: scripts/setup.sh [extra] (e.g. "test").
# torch 2.13.0 goes in first: pip takes the CPU build from this machine's local wheel, whereas
# a bare `torch` requirement would pull several GB of CUDA packages from the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -c 'import torch' 2>/dev/null || pip install --quiet torch==2.13.0
# llama-cpp-python compiles from source the first time (~5 min); pip caches the wheel.
pip install --quiet -e ".${extra:+[$extra]}"
# Build the cloud engine's CPU attention kernel now (~30 s once, cached in ~/.cache/tandem/kernels),
# so the first `tandem serve` compiles nothing. Without a compiler the engine uses its portable path.
python -c 'from cloud_engine.kernels.cpu_build import cpu_kernels; cpu_kernels()' || true
# Export all-MiniLM-L6-v2 to ONNX now (~30 s once, cached in ~/.cache/tandem/prompt_router): fp32 serves
# POST /v1/embeddings, int8 is what routers trained from traffic run; the first request then waits for nothing.
python -c 'from router.prompt_router.embedder_export import ensure_embedder; ensure_embedder(precision="int8")' || true
# Decide the local engine's prefill_weights=auto for the embedded model on this machine now (~10 s once: converts
# 16-bit copies of the weights and times prompts through each, cached in ~/.cache/tandem/prefill-weights).
python -c 'from local_runtime.prefill_choice import measurement; from sdk.engine_common.model_files import default_model_path as m; import os; measurement(m(), os.cpu_count() or 1)' || true
# Parse the embedded GGUF for the cloud engine now (~20 s once, cached in ~/.cache/tandem/gguf:
# cloud_engine/loader/gguf_cache.py), so the first `tandem serve` has its cloud tier up in seconds.
python -c 'from cloud_engine.loader import load_model; load_model()' || true
# The gpu extra's onnxruntime-gpu shares the `onnxruntime` package with the CPU build that
# tandem depends on; remove the CPU build and reinstall the GPU one so its files win.
if [[ ",${extra}," == *",gpu,"* ]]; then
    pip uninstall --quiet -y onnxruntime
    pip install --quiet --force-reinstall --no-deps "onnxruntime-gpu>=1.17"
fi
