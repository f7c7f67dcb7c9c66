#!/usr/bin/env bash
# The cloud engine on an NVIDIA GPU: its tests and its throughput bench, in one short run.
#
# Made for a lent GPU machine that reaches no network and has its own Python with CUDA torch:
# the project's other dependencies travel as wheels in .whl/ (cp312), and SmolLM2's tokenizer in
# .gpu/smollm2-tokenizer (the 98 MB GGUF cannot travel, so the benches time random weights in
# SmolLM2's shapes: bench.random_model). `bash scripts/cuda-prepare.sh` makes both here; the device
# call carries [".whl", ".gpu"]. Tests that read the embedded GGUF are left out.
# Results land in $OUT (or ./cuda-check-out).
set -u
OUT=${OUT:-$PWD/cuda-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TANDEM_KERNEL_CACHE=/tmp/tandem-kernels
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"

step() {  # step NAME SECONDS CMD...: one bounded step, its log in $OUT
    local name=$1 limit=$2; shift 2
    [ "$limit" = 0 ] && { echo "=== $name: not run (limit 0)"; return; }
    echo "=== $name (limit ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    tail -n 25 "$OUT/$name.log"
}

TOK=.gpu/smollm2-tokenizer
step model_135m 60 python3 -m bench.random_model --shape smollm2-135m --tokenizer $TOK --out /tmp/smollm2-135m --device cuda
step sanity 90 python3 -c "
from cloud_engine.llm import LLM
from sdk.protocol.engine import SamplingParams
llm = LLM('/tmp/smollm2-135m', kv_cache_gb=1.0)
out = llm.generate(['The capital of France is'], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
print(llm.engine.device, llm.engine.dtype, llm.engine.attention_backend, out.token_ids)"
step bench_135m ${BENCH_135M_S:-150} python3 -m bench.engine_throughput ${BENCH_MODE:---quick} --model /tmp/smollm2-135m --json "$OUT/engine_throughput_cuda_135m.json"
step tests ${TESTS_S:-240} python3 -m pytest tests/cloud_engine -v -p no:cacheprovider -rs --durations=15 \
    --ignore tests/cloud_engine/test_cloud_engine_greedy.py --ignore tests/cloud_engine/test_gguf_loader.py \
    --ignore tests/cloud_engine/test_real_gguf.py --ignore tests/cloud_engine/test_cpu_attention.py \
    --ignore tests/cloud_engine/test_packed_linear.py --ignore tests/cloud_engine/test_kernel_build_lock.py \
    -k "not real_model and not test_the_cached_tokenizer_is_the_converted_one"
step profile_135m ${PROFILE_S:-90} python3 scripts/cuda_step_profile.py /tmp/smollm2-135m 16 "$OUT/decode_step_profile_135m_b16.txt"
step model_1_7b 90 python3 -m bench.random_model --shape smollm2-1.7b --tokenizer $TOK --out /tmp/smollm2-1.7b --device cuda
step bench_1_7b ${BENCH_1_7B_S:-150} python3 -m bench.engine_throughput --quick --model /tmp/smollm2-1.7b --json "$OUT/engine_throughput_cuda_1.7b.json"
nvidia-smi --query-gpu=memory.used --format=csv
