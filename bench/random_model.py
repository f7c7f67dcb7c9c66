"""Write an HF model directory with random weights in a real model's shape, for speed benches.

    python -m bench.random_model --shape smollm2-135m [--family qwen3] --out /tmp/smollm2-random [--tokenizer DIR]

Throughput does not depend on the weights' values (every bench that uses this ignores EOS,
so each request produces exactly its requested token count), so a machine that cannot hold
the embedded GGUF (the GPU machines take at most 64 MiB of files, the GGUF is 98 MB) can
still time the engine on the real shape. Figures measured this way say so: the report's
`model` names the shape and "random weights". Acceptance rates of speculative decoding DO
depend on the weights: never time a speculative run on this.

`--family` writes another architecture in the same shape (its own layout on SmolLM2-135M's widths,
depth and heads): Qwen3 (per-head q/k norms), Gemma 3 (four norms a layer, GeGLU, five local
layers of a 512-token window to one global, as Gemma-3-270M), Phi-3 (fused projections, rope on
three quarters of each head as Phi-4-mini), and Qwen3-MoE (8 experts, top 2, each as wide as the
dense MLP), so bench.engine_throughput can time each family's code on the same dimensions.

The tokenizer is SmolLM2's (exported from the embedded GGUF here when --tokenizer is not
given, or an exported copy, so prompts tokenize as they would with the real model).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

# Public configs; the larger shapes use SmolLM2's 49,152-token vocabulary so one tokenizer serves all.
SHAPES = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "smollm2-360m": dict(
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "smollm2-1.7b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        rope_theta=130000.0,
        tie_word_embeddings=True,
    ),
}
VOCAB_SIZE = 49152
RANDOM_WEIGHTS_FILE = "random_weights.json"
FAMILIES = ("llama", "qwen3", "gemma3", "phi3", "qwen3-moe")


def family_config(family: str, shape: dict, common: dict):
    """A transformers config of `family` with `shape`'s dimensions (see the module docstring)."""
    import transformers

    dims = {**shape, **common}
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]  # Qwen3's config would default to 128
    if family == "llama":
        return transformers.LlamaConfig(**dims, architectures=["LlamaForCausalLM"])
    if family == "qwen3":
        return transformers.Qwen3Config(**dims, head_dim=head_dim, architectures=["Qwen3ForCausalLM"])
    if family == "phi3":
        theta = dims.pop("rope_theta")
        rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.75}
        return transformers.Phi3Config(**dims, rope_parameters=rope, architectures=["Phi3ForCausalLM"])
    if family == "gemma3":
        theta = dims.pop("rope_theta")
        layers = dims["num_hidden_layers"]
        return transformers.Gemma3TextConfig(
            **dims,
            head_dim=head_dim,
            sliding_window=512,
            layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            pad_token_id=0,
            architectures=["Gemma3ForCausalLM"],
        )
    if family == "qwen3-moe":
        return transformers.Qwen3MoeConfig(
            **dims,
            head_dim=head_dim,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=dims["intermediate_size"],
            norm_topk_prob=True,
            architectures=["Qwen3MoeForCausalLM"],
        )
    raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")


def export_tokenizer(out_dir: str) -> None:
    """SmolLM2's tokenizer and chat template, read from the embedded GGUF, as HF files."""
    from cloud_engine.loader.tokenizer import load_gguf_tokenizer
    from sdk.engine_common.model_files import default_model_path

    load_gguf_tokenizer(default_model_path()).save_pretrained(out_dir)


def write_random_model(
    shape: str,
    out_dir: str,
    tokenizer_dir: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    family: str = "llama",
) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.makedirs(out_dir, exist_ok=True)
    if tokenizer_dir is None:
        export_tokenizer(out_dir)
    else:
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    common = dict(
        vocab_size=VOCAB_SIZE, max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2
    )
    config = family_config(family, SHAPES[shape], common)
    torch.manual_seed(seed)
    with torch.device(device):  # initialising a 1.7B model on a GPU takes seconds instead of a minute
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, RANDOM_WEIGHTS_FILE), "w") as f:  # how benches know to say "random weights"
        json.dump({"shape": shape, "family": family, "seed": seed}, f)
    return out_dir


def describe_model(path: str) -> str:
    """What a report calls the model at `path`: its file or folder name, and the shape when the weights are random."""
    marker = os.path.join(path, RANDOM_WEIGHTS_FILE)
    if os.path.isdir(path) and os.path.exists(marker):
        with open(marker) as f:
            marker = json.load(f)
        family = marker.get("family", "llama")
        return f"{marker['shape']} shape, {family} family, random weights (bench.random_model), SmolLM2 tokenizer"
    return os.path.basename(path.rstrip("/")) + (" (dequantized)" if path.endswith(".gguf") else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--family", choices=FAMILIES, default="llama", help="the architecture (module docstring)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer", help="an HF tokenizer directory (default: exported from the embedded GGUF)")
    parser.add_argument("--export-tokenizer-only", action="store_true", help="write only the tokenizer files to --out")
    parser.add_argument("--device", default="cpu", help="where to initialise the weights")
    args = parser.parse_args()
    if args.export_tokenizer_only:
        os.makedirs(args.out, exist_ok=True)
        export_tokenizer(args.out)
    else:
        write_random_model(args.shape, args.out, args.tokenizer, device=args.device, family=args.family)
    print(args.out)


if __name__ == "__main__":
    main()
