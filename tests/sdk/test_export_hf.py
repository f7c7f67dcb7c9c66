"""`tandem export-hf`: the GGUF as an HF directory (the full export runs in scripts/setup-vllm.sh,
under tests/sdk/test_vllm_cloud_real.py); here the command's checks and its idempotence."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from sdk.cli.app import app
from sdk.cli.export_hf import STAMP_FILE, source_stamp, write_hf_checkpoint
from sdk.engine_common.model_files import default_model_path


def test_bad_arguments_are_refused_before_anything_loads(tmp_path):
    runner = CliRunner()
    too_many = runner.invoke(app, ["export-hf", "a.gguf", "b", "c"])
    assert too_many.exit_code == 2 and "[GGUF] DIR" in too_many.output
    missing = runner.invoke(app, ["export-hf", str(tmp_path / "nope.gguf"), str(tmp_path / "out")])
    assert missing.exit_code == 2 and "model file not found" in missing.output
    dtype = runner.invoke(app, ["export-hf", str(tmp_path / "out"), "--dtype", "int4"])
    assert dtype.exit_code == 2 and "--dtype" in dtype.output


def test_an_up_to_date_export_is_kept_and_a_foreign_directory_refused(tmp_path):
    gguf = default_model_path()
    done = tmp_path / "done"
    done.mkdir()
    (done / STAMP_FILE).write_text(json.dumps(source_stamp(gguf, "bfloat16")))
    assert write_hf_checkpoint(gguf, str(done)) == str(done)  # the stamp matches: nothing is rewritten
    assert sorted(p.name for p in done.iterdir()) == [STAMP_FILE]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(typer.BadParameter, match="not a tandem export"):
        write_hf_checkpoint(gguf, str(foreign))
    assert (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.slow  # about 20-40 s: SmolLM2's vocabulary read from the GGUF by transformers
def test_a_qwen3_gguf_exports_as_the_same_qwen3_model(tmp_path):
    """No real Qwen3 GGUF is on the package index here, so a tiny random-weight one is written as llama.cpp's
    converter writes it, with the embedded SmolLM2's tokenizer (Gemma 3's real file: tests/cloud_engine/
    test_real_gemma3.py; vLLM serving this export: tests/sdk/test_vllm_cloud_real.py). The export is a Qwen3
    checkpoint with the GGUF's vocabulary, id for id, and the model's logits."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.cloud_engine.gguf_writer import write_tiny_qwen3_gguf

    smollm2 = default_model_path()
    gguf_path = tmp_path / "tiny-qwen3.gguf"
    model = write_tiny_qwen3_gguf(gguf_path, tokenizer_from=smollm2)

    out = write_hf_checkpoint(str(gguf_path), str(tmp_path / "qwen3-hf"), dtype="float32")

    saved = json.loads((tmp_path / "qwen3-hf" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3ForCausalLM"] and saved["model_type"] == "qwen3"
    assert "quantization_config" not in saved  # plain tensors: a server must not look for GGUF blocks
    tokenizer = AutoTokenizer.from_pretrained(out)
    gguf_tokens = gguf.GGUFReader(smollm2).fields["tokenizer.ggml.tokens"].contents()  # byte-level BPE spellings
    assert tokenizer.convert_ids_to_tokens(list(range(len(gguf_tokens)))) == gguf_tokens
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer("The capital of France is Paris, and of Italy").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, model(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.slow  # about 20-40 s: SmolLM2's vocabulary read from the GGUF by transformers
def test_an_export_transformers_reads_incompletely_is_refused(tmp_path, monkeypatch):
    """Without the head width from the file, transformers gives Qwen3 its default 128, re-initialises every
    q/k/v tensor of the file (64 wide here) and only warns: the export must refuse rather than save that."""
    from transformers import AutoConfig

    import sdk.cli.export_hf as export_hf
    from tests.cloud_engine.gguf_writer import write_tiny_qwen3_gguf

    gguf_path = tmp_path / "tiny-qwen3.gguf"
    write_tiny_qwen3_gguf(gguf_path, tokenizer_from=default_model_path())
    monkeypatch.setattr(
        export_hf, "_gguf_config", lambda folder, name: AutoConfig.from_pretrained(folder, gguf_file=name)
    )
    with pytest.raises(ValueError, match="incompletely"):
        write_hf_checkpoint(str(gguf_path), str(tmp_path / "out"), dtype="float32")
    assert not (tmp_path / "out").exists()
