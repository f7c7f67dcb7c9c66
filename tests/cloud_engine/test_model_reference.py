"""Our paged model against transformers' own forward, on tiny random-weight checkpoints.

Each checkpoint is saved with save_pretrained (safetensors) and loaded back through
load_model, so config parsing, name mapping, fused projections, rope scaling, GQA and
paged attention are all checked against one reference: HF logits on the full sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cloud_engine.loader import load_model
from tests.cloud_engine.kernel_helpers import built_cpu_kernels, cpu_kernels_or_none
from tests.cloud_engine.paged_helpers import PagedBatchBuilder, make_kv_caches
from tests.cloud_engine.tiny_models import (
    VOCAB_SIZE,
    gemma3_config,
    llama_config,
    mistral_config,
    mixtral_config,
    phi3_config,
    qwen2_config,
    qwen3_config,
    qwen3_moe_config,
    random_tokens,
    save_tiny_tokenizer,
)

BLOCK_SIZE = 4
NUM_BLOCKS = 64
ATOL = 1e-4


FAMILIES = {
    "llama3": llama_config,
    "mistral": mistral_config,
    "qwen2": qwen2_config,
    "qwen3": qwen3_config,
    "phi3": phi3_config,
    "qwen3-moe": qwen3_moe_config,
    "mixtral": mixtral_config,
    "gemma3": gemma3_config,
}


@pytest.fixture(scope="module", params=list(FAMILIES.values()), ids=list(FAMILIES))
def tiny_pair(request, tmp_path_factory):
    """(HF reference model, our LoadedModel) sharing random weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(request.param(), attn_implementation="eager").eval()
    with torch.no_grad():  # HF inits biases to zero and norms to one: randomise so they are tested
        for name, param in hf.named_parameters():
            noise = torch.randn_like(param) * 0.1
            param.copy_(1 + noise if "norm" in name else noise * 2 if name.endswith("bias") else param + noise)
    path = tmp_path_factory.mktemp(request.param.__name__)
    # Mistral goes through the sharded layout (index + several files), the others one file.
    hf.save_pretrained(path, max_shard_size="50KB" if request.param is mistral_config else "1GB")
    save_tiny_tokenizer(path)
    return hf, load_model(str(path), dtype=torch.float32)


def reference_logits(hf, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0].float()


@pytest.fixture(params=["torch", "cpu-kernel"])
def decode_kernel(request):
    """Decode attention through the portable path and through the CPU kernel."""
    if request.param == "torch":
        return None
    return built_cpu_kernels().paged_decode_attention


def run_schedule(
    loaded, sequences: dict[str, list[int]], schedule: list[dict[str, int]], decode_kernel=None
) -> dict[str, dict[int, torch.Tensor]]:
    """Run the steps; logits of every row, by sequence and position."""
    model = loaded.model
    dtype = model.model.embed_tokens.weight.dtype
    model.bind_kv_caches(make_kv_caches(loaded.config, NUM_BLOCKS, BLOCK_SIZE, dtype=dtype))
    builder = PagedBatchBuilder(NUM_BLOCKS, BLOCK_SIZE, seed=1, decode_kernel=decode_kernel)
    for seq_id, tokens in sequences.items():
        builder.add_sequence(seq_id, tokens)
    out: dict[str, dict[int, torch.Tensor]] = {seq_id: {} for seq_id in sequences}
    with torch.inference_mode():
        for step in schedule:
            batch = builder.step(step)
            logits = model.compute_logits(model(batch.input_ids, batch.positions, batch.metadata))
            assert logits.dtype == torch.float32 and logits.shape == (len(batch.row_owners), VOCAB_SIZE)
            for row, (seq_id, pos) in enumerate(batch.row_owners):
                out[seq_id][pos] = logits[row]
    return out


def assert_matches_reference(hf, sequences, got) -> None:
    for seq_id, tokens in sequences.items():
        expected = reference_logits(hf, tokens)
        assert sorted(got[seq_id]) == list(range(len(tokens))), f"{seq_id}: not every position was computed"
        ours = torch.stack([got[seq_id][pos] for pos in range(len(tokens))])
        torch.testing.assert_close(ours, expected, atol=ATOL, rtol=0, msg=lambda m: f"sequence {seq_id}: {m}")


def test_config_read_from_checkpoint(tiny_pair):
    hf, loaded = tiny_pair
    shards = list(Path(loaded.source).glob("*.safetensors"))
    assert len(shards) > 1 if loaded.config.architecture == "MistralForCausalLM" else len(shards) == 1
    assert loaded.config.num_key_value_heads == hf.config.num_key_value_heads
    assert loaded.config.attention_bias == (loaded.config.architecture == "Qwen2ForCausalLM")
    assert loaded.eos_token_ids >= {2} and loaded.bos_token_id == 1


def test_full_prompt_in_one_prefill(tiny_pair):
    hf, loaded = tiny_pair
    sequences = {"a": random_tokens(19, seed=1)}
    got = run_schedule(loaded, sequences, [{"a": 19}])
    assert_matches_reference(hf, sequences, got)


def test_chunked_prefill_then_decodes(tiny_pair, decode_kernel):
    hf, loaded = tiny_pair
    sequences = {"a": random_tokens(23, seed=2)}
    # Chunks that start and end mid-block, then single-token decode steps.
    schedule = [{"a": 5}, {"a": 7}, {"a": 3}] + [{"a": 1}] * 8
    got = run_schedule(loaded, sequences, schedule, decode_kernel)
    assert_matches_reference(hf, sequences, got)


def test_mixed_batches_of_decodes_and_prefill_chunks(tiny_pair, decode_kernel):
    hf, loaded = tiny_pair
    sequences = {
        name: random_tokens(n, seed=10 + i)
        for i, (name, n) in enumerate([("a", 14), ("b", 9), ("c", 30), ("d", 6), ("e", 12)])
    }
    schedule = [
        {"a": 10, "b": 3},  # two fresh prefills
        {"b": 4, "a": 1, "c": 11},  # a decodes; b continues mid-block; c starts
        {"c": 13, "a": 1, "b": 1, "d": 6},  # two decodes, a chunk over cached context, a whole prompt
        {"a": 1, "b": 1, "c": 6, "e": 5},
        {"a": 1, "e": 7},
    ]
    got = run_schedule(loaded, sequences, schedule, decode_kernel)
    assert_matches_reference(hf, sequences, got)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tracks_float32(tiny_pair, dtype):
    """bf16/fp16 weights, caches and attention stay within rounding of HF's float32 logits."""
    hf, loaded = tiny_pair
    half = load_model(loaded.source, dtype=dtype)
    assert half.model.model.embed_tokens.weight.dtype == dtype
    kernels = cpu_kernels_or_none() if dtype == torch.bfloat16 else None  # the kernel reads bf16 caches, not fp16
    sequences = {"a": random_tokens(15, seed=3), "b": random_tokens(7, seed=4)}
    schedule = [{"a": 6, "b": 6}, {"a": 5, "b": 1}, {"a": 3}, {"a": 1}]  # b and then a finish with decodes
    got = run_schedule(half, sequences, schedule, kernels.paged_decode_attention if kernels else None)
    for seq_id, tokens in sequences.items():
        expected = reference_logits(hf, tokens)
        ours = torch.stack([got[seq_id][pos] for pos in range(len(tokens))])
        # Rounding-level error (bf16 keeps 8 mantissa bits, fp16 11), not a layout bug.
        tolerance = (0.15 if dtype == torch.bfloat16 else 0.02) * expected.abs().max()
        assert (ours - expected).abs().max() < tolerance, f"{dtype} sequence {seq_id} drifted from float32"
