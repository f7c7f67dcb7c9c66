"""The GGUF load cache: a hit gives back exactly what the slow path computes, and anything else is a miss."""

from __future__ import annotations

import os

import pytest
import torch

from cloud_engine.loader import gguf_cache
from cloud_engine.loader.gguf import read_gguf_checkpoint
from cloud_engine.loader.gguf_cache import load_cached_checkpoint, storing_weights
from tests.cloud_engine.gguf_writer import write_gguf
from tests.cloud_engine.tiny_models import llama_config


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TANDEM_GGUF_CACHE", str(root))
    return root


@pytest.fixture
def tiny_gguf(tmp_path):
    """A llama GGUF with llama3 rope factors (rope_freqs) and rope-interleaved Q/K rows."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(llama_config(), attn_implementation="eager").eval()
    path = tmp_path / "tiny-llama.gguf"
    write_gguf(path, hf, "llama")
    return str(path)


def test_a_hit_is_bit_for_bit_the_slow_path(cache_root, tiny_gguf):
    assert load_cached_checkpoint(tiny_gguf) is None
    checkpoint = read_gguf_checkpoint(tiny_gguf)
    streamed = list(storing_weights(checkpoint))  # the first load: tensors pass through unchanged

    cached = load_cached_checkpoint(tiny_gguf)
    assert cached is not None
    assert cached.config == checkpoint.config
    assert cached.config.rope_scaling["rope_type"] == "per_frequency"  # rope_freqs survived the round trip
    assert cached.metadata == checkpoint.metadata
    fresh = list(read_gguf_checkpoint(tiny_gguf).weights())
    again = list(cached.weights())
    assert [name for name, _ in again] == [name for name, _ in fresh] == [name for name, _ in streamed]
    for (name, expected), (_, got), (_, passed) in zip(fresh, again, streamed):
        assert got.dtype == torch.float32 and torch.equal(got, expected), name
        assert torch.equal(passed, expected), name


def test_a_changed_file_is_a_miss(cache_root, tiny_gguf):
    list(storing_weights(read_gguf_checkpoint(tiny_gguf)))
    assert load_cached_checkpoint(tiny_gguf) is not None
    stat = os.stat(tiny_gguf)
    os.utime(tiny_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert load_cached_checkpoint(tiny_gguf) is None


def test_a_load_that_stops_early_leaves_no_entry(cache_root, tiny_gguf):
    weights = storing_weights(read_gguf_checkpoint(tiny_gguf))
    next(weights)
    weights.close()  # what build_model's error does to the generator
    assert load_cached_checkpoint(tiny_gguf) is None
    leftovers = [p.name for p in cache_root.rglob("*") if p.is_file()]
    assert leftovers == []


def test_off_caches_nothing(tmp_path, monkeypatch, tiny_gguf):
    monkeypatch.setenv("TANDEM_GGUF_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    list(storing_weights(read_gguf_checkpoint(tiny_gguf)))
    assert load_cached_checkpoint(tiny_gguf) is None
    assert not (tmp_path / "xdg").exists()


def test_prune_keeps_the_most_recently_used_within_the_byte_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_cache, "MAX_CACHE_BYTES", 250)
    sizes = {"big-old": 200, "tiny-1": 10, "tiny-2": 10, "big-new": 200, "tiny-newest": 10}
    for age, (name, size) in enumerate(sizes.items()):  # oldest first
        entry = tmp_path / name
        entry.mkdir()
        (entry / "weights.safetensors").write_bytes(b"x" * size)
        os.utime(entry, (1_000_000 + age, 1_000_000 + age))
    gguf_cache._prune(tmp_path)
    # Newest first: tiny-newest 10, big-new 210, tiny-2 220, tiny-1 230, big-old 430 > 250: only it goes,
    # however many tiny entries (tests' files) came after it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big-new", "tiny-1", "tiny-2", "tiny-newest"]


def test_the_newest_entry_stays_even_over_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_cache, "MAX_CACHE_BYTES", 5)
    entry = tmp_path / "only"
    entry.mkdir()
    (entry / "weights.safetensors").write_bytes(b"x" * 50)
    gguf_cache._prune(tmp_path)
    assert entry.is_dir()


def test_the_cached_tokenizer_is_the_converted_one(cache_root, monkeypatch):
    """The embedded SmolLM2's tokenizer: converted from the GGUF once, then read back, unchanged."""
    from transformers import AutoTokenizer

    from cloud_engine.loader.tokenizer import load_gguf_tokenizer
    from sdk.engine_common.model_files import default_model_path

    path = default_model_path()
    converted = load_gguf_tokenizer(path)
    calls = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(k) or real(*a, **k))
    cached = load_gguf_tokenizer(path)
    assert calls and all("gguf_file" not in kwargs for kwargs in calls)  # read back, not converted again

    assert type(cached) is type(converted) and len(cached) == len(converted)
    assert cached.convert_ids_to_tokens(list(range(len(cached)))) == converted.convert_ids_to_tokens(
        list(range(len(converted)))
    )
    assert cached.get_added_vocab() == converted.get_added_vocab()
    assert {i: str(t) for i, t in cached.added_tokens_decoder.items()} == {
        i: str(t) for i, t in converted.added_tokens_decoder.items()
    }
    assert (cached.bos_token_id, cached.eos_token_id, cached.pad_token_id, cached.unk_token_id) == (
        converted.bos_token_id,
        converted.eos_token_id,
        converted.pad_token_id,
        converted.unk_token_id,
    )
    texts = [
        "Hello, world!",
        "  spaces\n\nand\ttabs",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
        "😀 中文 ünïcödé",
        "",
    ]
    for text in texts:
        for split in (False, True):
            ids = converted(text, add_special_tokens=False, split_special_tokens=split)["input_ids"]
            assert cached(text, add_special_tokens=False, split_special_tokens=split)["input_ids"] == ids
            assert cached.decode(ids) == converted.decode(ids)
