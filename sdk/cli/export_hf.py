"""`tandem export-hf [GGUF] DIR`: a GGUF as a Hugging Face checkpoint directory, for servers that take one.

vLLM (and SGLang, TGI) load HF directories, not tandem's embedded GGUF: this writes the same model
(dequantized by transformers' GGUF reader) with its tokenizer and chat template, so a cloud tier run
by vLLM serves the very weights the local tier quantized, and shares its vocabulary (token-id
continuation then works: docs/cloud-at-scale.md, "cloud tier at scale"). The export is idempotent: DIR keeps a
stamp of the source file (path, size, mtime) and the dtype, and a second run with the same ones
only prints DIR.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import typer

STAMP_FILE = "tandem-export.json"
DTYPES = ("bfloat16", "float16", "float32")


def export_hf(
    paths: list[str] = typer.Argument(
        ...,
        metavar="[GGUF] DIR",
        help="The GGUF file (default: the embedded model) "
        "and where the HF checkpoint goes (created; replaced when stale).",
    ),
    dtype: str = typer.Option(
        "bfloat16", "--dtype", help=f"Weights' dtype: one of {', '.join(DTYPES)}.", case_sensitive=False
    ),
) -> None:
    """Export a GGUF (default: the embedded model) as a Hugging Face directory for vLLM or SGLang."""
    from sdk.engine_common.model_files import ModelNotFoundError, resolve_model_path

    if len(paths) > 2:
        raise typer.BadParameter(f"give [GGUF] DIR, got {len(paths)} paths")
    gguf, out_dir = (None, paths[0]) if len(paths) == 1 else paths
    if dtype.lower() not in DTYPES:
        raise typer.BadParameter(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    try:
        path = resolve_model_path(gguf)
    except ModelNotFoundError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(write_hf_checkpoint(path, out_dir, dtype.lower()))


def source_stamp(gguf_path: str, dtype: str) -> dict:
    stat = os.stat(gguf_path)
    return {"gguf": os.path.abspath(gguf_path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "dtype": dtype}


def write_hf_checkpoint(gguf_path: str, out_dir: str, dtype: str = "bfloat16") -> str:
    """The HF directory for `gguf_path` at `out_dir` (written unless already there); returns its path.
    Written to a temporary sibling and renamed into place, so an interrupted export leaves no half directory."""
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    stamp = source_stamp(gguf_path, dtype)
    if _stamp_of(out_dir) == stamp:
        return out_dir
    if os.path.exists(out_dir) and not os.path.isfile(os.path.join(out_dir, STAMP_FILE)) and os.listdir(out_dir):
        raise typer.BadParameter(f"{out_dir} exists and is not a tandem export; give an empty or new directory")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".tandem-export-", dir=parent)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model, loading = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=name,
            config=_gguf_config(folder, name),
            dtype=getattr(torch, dtype),
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported, then refused below with the file's name
            **_dense(),
        )
        # A tensor transformers could not place (missing, or of another shape) is left re-initialised: such an
        # export would hold random weights, so it is refused, naming them.
        unplaced = [*loading["missing_keys"], *(key for key, *_ in loading["mismatched_keys"])]
        if unplaced:
            raise ValueError(
                f"transformers read {gguf_path} incompletely ({len(unplaced)} tensors missing or of another shape, "
                f"e.g. {', '.join(sorted(unplaced)[:3])}); not exporting a model with random weights there"
            )
        # The weights are plain tensors now: a quantization_config would make a server look for GGUF blocks.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        with open(os.path.join(work, STAMP_FILE), "w") as file:
            json.dump(stamp, file, indent=1)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out_dir


def _gguf_config(folder: str, name: str):
    """transformers' config for the GGUF, with the head width the file states. Its GGUF reader does not map
    `<arch>.attention.key_length`, so a family whose config has a head_dim of its own (Qwen3: 128 by default)
    would get that default, and every q/k/v tensor of another width would be re-initialised."""
    import gguf
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    fields = gguf.GGUFReader(os.path.join(folder, name)).fields
    arch = fields["general.architecture"].contents()
    key_length = fields.get(f"{arch}.attention.key_length")
    if key_length is not None and getattr(config, "head_dim", None) not in (None, key_length.contents()):
        config.head_dim = key_length.contents()
    return config


def _dense() -> dict:
    """transformers >= 5.2x keeps GGUF weights packed unless told to unpack them; older ones always unpack."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _stamp_of(out_dir: str) -> dict | None:
    try:
        with open(os.path.join(out_dir, STAMP_FILE)) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None
