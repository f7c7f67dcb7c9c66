"""oneDNN-packed linear layers (bf16 on CPU) give the same numbers as the plain model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cloud_engine.model.config import ModelConfig
from cloud_engine.model.llama import LlamaForCausalLM
from cloud_engine.model.packed_linear import PackedLinear, can_pack
from tests.cloud_engine.paged_helpers import PagedBatchBuilder, make_kv_caches
from tests.cloud_engine.tiny_models import llama_config, random_tokens

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16), reason="no oneDNN bf16 packing here")


@pytest.mark.parametrize("rows", [1, 2, 31, 32, 100])
def test_packed_linear_equals_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen).bfloat16()
    bias = torch.randn(96, generator=gen).bfloat16()
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    torch.testing.assert_close(PackedLinear(weight, bias)(x), F.linear(x, weight, bias), atol=1e-2, rtol=1e-2)


def test_only_bf16_on_cpu_is_packed():
    assert not can_pack(torch.device("cpu"), torch.float32)
    assert not can_pack(torch.device("cuda"), torch.bfloat16)


def test_packed_model_gives_the_logits_of_the_plain_model():
    torch.manual_seed(0)
    model_config = ModelConfig.from_hf_config(llama_config().to_dict())
    plain = LlamaForCausalLM(model_config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for param in plain.parameters():
            param.copy_(torch.randn_like(param) * 0.1 + (1 if param.dim() == 1 else 0))
    packed = LlamaForCausalLM(model_config).to(torch.bfloat16).eval()
    packed.load_state_dict(plain.state_dict())
    assert packed.pack_for_cpu() == 3 * 4 + 1  # four linears per layer, plus the LM head
    logits = []
    for model in (plain, packed):
        model.bind_kv_caches(make_kv_caches(model_config, 16, 4, dtype=torch.bfloat16))
        builder = PagedBatchBuilder(16, 4, seed=2)
        builder.add_sequence("a", random_tokens(9, seed=5))
        batch = builder.step({"a": 9})
        with torch.inference_mode():
            logits.append(model.compute_logits(model(batch.input_ids, batch.positions, batch.metadata)))
    torch.testing.assert_close(logits[1], logits[0], atol=2e-2, rtol=2e-2)
