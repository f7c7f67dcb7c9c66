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
