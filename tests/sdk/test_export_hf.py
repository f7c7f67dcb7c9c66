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
