"""Tiny random-weight transformers configs (and a word-level tokenizer) for model tests."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

VOCAB_SIZE = 300
SMALL = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def llama_config():
    from transformers import LlamaConfig

    # original context 16 puts the head's frequencies in all three llama3 bands (kept, blended, stretched).
    rope = {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    return LlamaConfig(
        **SMALL, rope_scaling=rope, rope_theta=10000.0, tie_word_embeddings=True, architectures=["LlamaForCausalLM"]
    )


def mistral_config():
    from transformers import MistralConfig

    return MistralConfig(**SMALL, sliding_window=None, architectures=["MistralForCausalLM"])


def qwen2_config():
    from transformers import Qwen2Config

    return Qwen2Config(**{**SMALL, "num_key_value_heads": 1}, rope_theta=1000.0, architectures=["Qwen2ForCausalLM"])


def qwen3_config():
    from transformers import Qwen3Config

    # head_dim wider than hidden / heads, as in the real Qwen3 models.
    return Qwen3Config(**SMALL, head_dim=32, rope_theta=1000000.0, architectures=["Qwen3ForCausalLM"])


def phi3_config():
    from transformers import Phi3Config

    # Phi-4-mini rotates a share of each head; half here, so the passed-through half is tested too.
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    return Phi3Config(
        **SMALL, rope_parameters=rope, pad_token_id=0, bos_token_id=1, eos_token_id=2, architectures=["Phi3ForCausalLM"]
    )


def qwen3_moe_config():
    from transformers import Qwen3MoeConfig

    # Layer 1 keeps a dense MLP (mlp_only_layers), the others route to 2 of 4 experts.
    return Qwen3MoeConfig(
        **SMALL,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        mlp_only_layers=[1],
        norm_topk_prob=False,
        architectures=["Qwen3MoeForCausalLM"],
    )


def mixtral_config():
    from transformers import MixtralConfig

    return MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, architectures=["MixtralForCausalLM"])


def gemma3_config(query_pre_attn_scalar: int = 24):
    from transformers import Gemma3TextConfig

    # A window of 6 positions (prompts here run to 30) in two local layers, then a global one; a query
    # scale of its own; the local layers' rope base differs from the global. A logit cap of 20 bends these
    # tiny models' logits (within about 2) by several times the reference tests' tolerance, so it is tested,
    # and leaves float16's rounding room (at 2 it squeezed the logits under their float16 error).
    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    return Gemma3TextConfig(
        **SMALL,
        head_dim=32,
        sliding_window=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters=rope,
        query_pre_attn_scalar=query_pre_attn_scalar,
        final_logit_softcapping=20.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["Gemma3ForCausalLM"],
    )


def save_tiny_tokenizer(path) -> None:
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB_SIZE)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(path)


def save_tiny_llama(path, config=None, save_tokenizer=None) -> str:
    """The tiny random-weight Llama (`config`, else llama_config(); weights from seed 0) saved at `path`
    with a tokenizer (`save_tokenizer`, else the word-level one); returns `path` as a str."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config or llama_config()).save_pretrained(path)
    (save_tokenizer or save_tiny_tokenizer)(path)
    return str(path)


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def save_byte_tokenizer(path) -> None:
    """A byte-level tokenizer with no merges (259 ids: <unk>, <s>, </s>, then one per byte), so a
    tiny model can spell anything, JSON included (structured-output tests)."""
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate(sorted(alphabet))}}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(path)
