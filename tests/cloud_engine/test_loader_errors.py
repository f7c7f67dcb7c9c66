"""Loading fails early with messages that say what is wrong and how to fix it."""

from __future__ import annotations

import json

import pytest
import torch

from cloud_engine.loader import InvalidModelError, ModelNotFoundError, UnsupportedArchitectureError, load_model
from cloud_engine.model.config import ModelConfig, ModelConfigError
from cloud_engine.model.registry import get_architecture

LLAMA_FIELDS = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def test_unsupported_hf_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 16}))
    with pytest.raises(UnsupportedArchitectureError) as info:
        load_model(str(tmp_path))
    message = str(info.value)
    assert "GPT2LMHeadModel" in message
    assert all(name in message for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "qwen2"))
    assert isinstance(info.value, ValueError)


def test_unsupported_gguf_architecture(tmp_path):
    import gguf

    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2' is not supported.*llama, mistral, qwen2"):
        load_model(str(path))


def test_missing_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="model not found: .*no-such-model.*directory or a .gguf file"):
        load_model(str(missing))


def test_directory_without_config(tmp_path):
    with pytest.raises(InvalidModelError, match="no config.json"):
        load_model(str(tmp_path))


def test_directory_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **LLAMA_FIELDS}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(InvalidModelError, match="convert them to safetensors"):
        load_model(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"not a model at all")
    with pytest.raises(InvalidModelError, match="not a GGUF file"):
        load_model(str(path))


def test_unsupported_dtype():
    with pytest.raises(ValueError, match="dtype torch.int8 is not supported"):
        load_model("unused", dtype=torch.int8)


def test_config_validation_says_what_to_fix():
    with pytest.raises(ModelConfigError, match="multiple of num_key_value_heads"):
        ModelConfig.from_hf_config({"architectures": ["LlamaForCausalLM"], **LLAMA_FIELDS, "num_key_value_heads": 3})
    with pytest.raises(ModelConfigError, match="rope_type 'yarn' is not supported; supported: default, linear, llama3"):
        ModelConfig.from_hf_config(
            {
                "architectures": ["LlamaForCausalLM"],
                **LLAMA_FIELDS,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            }
        )
    with pytest.raises(ModelConfigError, match="llama3 rope scaling lacks"):
        ModelConfig.from_hf_config(
            {
                "architectures": ["LlamaForCausalLM"],
                **LLAMA_FIELDS,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
            }
        )


def test_config_reads_transformers_4_and_5_rope_layouts():
    old = ModelConfig.from_hf_config(
        {
            "architectures": ["LlamaForCausalLM"],
            **LLAMA_FIELDS,
            "rope_theta": 5e5,
            "rope_scaling": {"type": "linear", "factor": 2.0},
        }
    )
    new = ModelConfig.from_hf_config(
        {
            "architectures": ["LlamaForCausalLM"],
            **LLAMA_FIELDS,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5},
        }
    )
    assert old.rope_theta == new.rope_theta == 5e5
    assert old.rope_scaling["rope_type"] == new.rope_scaling["rope_type"] == "linear"
    plain = ModelConfig.from_hf_config(
        {
            "architectures": ["Qwen2ForCausalLM"],
            **LLAMA_FIELDS,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        }
    )
    assert plain.rope_scaling is None and plain.rope_theta == 1e6
    assert plain.attention_bias and not plain.attention_output_bias  # Qwen2: QKV bias only
    assert get_architecture("Qwen2ForCausalLM") is get_architecture("qwen2")


def test_family_configs_that_cannot_run_are_refused_by_name():
    phi3 = {"architectures": ["Phi3ForCausalLM"], **LLAMA_FIELDS}
    with pytest.raises(ModelConfigError, match="rope_type 'longrope' is not supported"):
        ModelConfig.from_hf_config({**phi3, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 2}})
    with pytest.raises(ModelConfigError, match="partial_rotary_factor 0.3 must leave an even number"):
        ModelConfig.from_hf_config({**phi3, "partial_rotary_factor": 0.3})  # 0.3 of 4 dimensions
    phi3_gguf = {"general.architecture": "phi3", "phi3.embedding_length": 16, "phi3.feed_forward_length": 32}
    phi3_gguf |= {"phi3.block_count": 1, "phi3.attention.head_count": 4, "phi3.vocab_size": 32}
    with pytest.raises(ModelConfigError, match="rope type 'longrope'.*not supported"):
        ModelConfig.from_gguf(phi3_gguf, tensor_names=["token_embd.weight", "rope_factors_long.weight"])
    gemma = {"architectures": ["Gemma3ForCausalLM"], **LLAMA_FIELDS, "sliding_window": 8}
    with pytest.raises(ModelConfigError, match="attn_logit_softcapping"):
        ModelConfig.from_hf_config({**gemma, "attn_logit_softcapping": 50.0})
    with pytest.raises(
        ModelConfigError, match="hidden_act 'gelu' is not supported; supported: silu, gelu_pytorch_tanh"
    ):
        ModelConfig.from_hf_config({**gemma, "hidden_activation": "gelu"})
    moe = {"architectures": ["Qwen3MoeForCausalLM"], **LLAMA_FIELDS, "num_experts": 4, "moe_intermediate_size": 8}
    with pytest.raises(ModelConfigError, match=r"num_experts_per_tok must be in 1..num_experts \(4\), got 5"):
        ModelConfig.from_hf_config({**moe, "num_experts_per_tok": 5})


def test_family_configs_read_in_the_hubs_layout():
    """config.json as the models' repositories ship them (transformers 4 keys), not as transformers 5 writes."""
    layers = dict(LLAMA_FIELDS, num_hidden_layers=12)
    gemma = ModelConfig.from_hf_config(
        {
            "architectures": ["Gemma3ForCausalLM"],
            **layers,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "query_pre_attn_scalar": 256,
            "hidden_activation": "gelu_pytorch_tanh",
        }
    )
    assert gemma.local_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10) and gemma.sliding_window == 512
    assert (gemma.rope_theta, gemma.rope_local_theta, gemma.query_pre_attn_scalar) == (1e6, 1e4, 256)
    assert gemma.qk_norm  # Gemma 3 always norms q and k
    moe = ModelConfig.from_hf_config(
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            **layers,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 8,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [3],
            "norm_topk_prob": True,
        }
    )
    assert moe.moe_layers == (1, 5, 7, 9, 11) and moe.num_experts == 8 and moe.qk_norm
    phi3 = ModelConfig.from_hf_config({"architectures": ["Phi3ForCausalLM"], **layers, "partial_rotary_factor": 0.5})
    assert phi3.rotary_dim == 2 and phi3.head_dim == 4
    # Other families' windows stay a cap on the context, not layers of their own.
    mistral = ModelConfig.from_hf_config({"architectures": ["MistralForCausalLM"], **layers, "sliding_window": 64})
    assert mistral.sliding_window == 64 and mistral.local_layers == ()
