"""The cloud engine's linear weights in int8 ([cloud] weight_dtype = int8, cloud_engine.model.int8_linear).

A layer must equal F.linear with its dequantized weight (q * scale) within float rounding, whatever its shape and row
count (the float32 kernel's tiles, row groups and K chunks all have tails); and an engine on int8 weights must answer
as the same model whose checkpoint holds those dequantized weights does. What int8 costs in answers against the
model's own weights is bench.kv_precision's measurement.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cloud_engine.config import CloudEngineConfig
from cloud_engine.cpu_features import cpu_flags
from cloud_engine.llm import LLM
from cloud_engine.model.int8_linear import (
    Int8Linear,
    quantize_per_channel,
    resolve_weight_dtype,
    tandem_kernel_takes_bf16,
)
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.kernel_helpers import built_cpu_kernels
from tests.cloud_engine.tiny_models import qwen2_config, qwen3_moe_config, random_tokens, save_tiny_tokenizer

BLOCK = 4


def reference(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.dequantized_weight(), bias)


def test_weights_quantize_per_output_channel_within_half_a_step():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 70, generator=gen) * torch.logspace(-5, 2, 40)[:, None]  # tiny to large rows
    weight[3] = 0.0
    quantized, scales = quantize_per_channel(weight)
    assert quantized.dtype == torch.int8 and scales.shape == (40,) and quantized.abs().max() <= 127
    assert torch.all((quantized.float() * scales[:, None] - weight).abs() <= scales[:, None] * 0.5 + 1e-7)
    assert torch.equal(quantized[3], torch.zeros_like(quantized[3])) and torch.isfinite(scales).all()


@pytest.mark.parametrize("out_features,in_features", [(37, 24), (64, 64), (300, 600), (16, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_kernel_equals_the_dequantized_weight(out_features, in_features, bias):
    built_cpu_kernels()
    gen = torch.Generator().manual_seed(out_features + in_features)
    layer = Int8Linear(
        torch.randn(out_features, in_features, generator=gen),
        torch.randn(out_features, generator=gen) if bias else None,
    )
    for rows in (1, 2, 3, 5, 6, 7, 13, 40):  # a lone row, each short group, whole groups and a tail
        x = torch.randn(rows, in_features, generator=gen)
        out = layer(x)
        assert out.dtype == torch.float32 and out.shape == (rows, out_features)
        torch.testing.assert_close(out, reference(layer, x), atol=1e-4, rtol=1e-5)
    x = torch.randn(2, 3, in_features, generator=gen)  # leading dimensions are kept
    torch.testing.assert_close(layer(x), reference(layer, x), atol=1e-4, rtol=1e-5)


def test_bfloat16_layers_run_the_kernel_this_build_has_and_equal_the_dequantized_weight():
    gen = torch.Generator().manual_seed(1)
    layer = Int8Linear(torch.randn(96, 64, generator=gen).bfloat16(), torch.randn(96, generator=gen).bfloat16())
    if tandem_kernel_takes_bf16():  # AVX512-BF16: tandem's tiles, float32 scales
        assert layer.tandem_kernel and layer.weight.shape == (6, 64, 16) and layer.scales.dtype == torch.float32
    else:  # torch's _weight_int8pack_mm layout
        assert not layer.tandem_kernel and layer.weight.shape == (96, 64) and layer.scales.dtype == torch.bfloat16
    for rows in (1, 9):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        out = layer(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), reference(layer, x), atol=0.1, rtol=0.02)  # bf16's 8-bit mantissa


@pytest.mark.parametrize("out_features,in_features", [(37, 24), (64, 64), (300, 601), (16, 1), (20, 513)])
@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_path_of_tandems_kernel_equals_the_dequantized_weight(out_features, in_features, bias):
    """AVX512-BF16 builds: bf16 pairs and vdpbf16ps, odd K (a last k alone, a last chunk of one k) included; the sums
    are float32's, so the result is the reference rounded to bf16, give or take its last bit."""
    built_cpu_kernels()
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU lacks AVX512-BF16: bf16 activations run torch's kernel (the test above)")
    assert tandem_kernel_takes_bf16(), "the CPU has AVX512-BF16, the kernel built without its bf16 path"
    gen = torch.Generator().manual_seed(out_features + in_features)
    layer = Int8Linear(
        torch.randn(out_features, in_features, generator=gen).bfloat16(),
        torch.randn(out_features, generator=gen).bfloat16() if bias else None,
    )
    for rows in (1, 2, 3, 5, 8, 9, 13, 40):  # the float path's lone row, each short group, whole groups, a tail
        x = torch.randn(rows, in_features, generator=gen).bfloat16()
        out = layer(x)
        assert out.dtype == torch.bfloat16 and out.shape == (rows, out_features)
        expected = reference(layer, x).bfloat16().float()
        torch.testing.assert_close(out.float(), expected, atol=1e-3, rtol=1 / 128)


def test_settings_int8_weights_cannot_honour_are_refused_by_name():
    with pytest.raises(ValueError, match="weight_dtype must be one of auto, int8, got 'fp8'"):
        CloudEngineConfig(weight_dtype="fp8")
    with pytest.raises(ValueError, match="weight_dtype int8 cannot be used: 8-bit weights run on CPU only"):
        resolve_weight_dtype("int8", torch.device("cuda"), torch.bfloat16)
    assert resolve_weight_dtype("auto", torch.device("cpu"), torch.float32) is False


# -- the engine on int8 weights ----------------------------------------------------------------------


def fake_quantize(model: nn.Module) -> None:
    """Every weight the engine quantizes (the linears, the embedding that is a tied LM head) replaced by its q * scale,
    so quantizing it again gives back the same values."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and not name.endswith("mlp.gate"):
                quantized, scales = quantize_per_channel(module.weight)
                module.weight.copy_(quantized.float() * scales[:, None])


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A Qwen2 (QKV bias, untied LM head) with random weights, as saved and with its weights dequantized."""
    from transformers import AutoModelForCausalLM

    dirs = {}
    for kind in ("plain", "dequantized"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(qwen2_config())
        if kind == "dequantized":
            fake_quantize(model)
        path = tmp_path_factory.mktemp(f"tiny-qwen2-{kind}")
        model.save_pretrained(path)
        save_tiny_tokenizer(path)
        dirs[kind] = str(path)
    return dirs


def make_llm(model_dir, **overrides) -> LLM:
    config = dict(
        dtype="float32",
        block_size=BLOCK,
        kv_cache_gb=0.002,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=96,
    )
    config.update(overrides)
    return LLM(model_dir, **config)


def tokens(llm: LLM, prompts, n: int = 16) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(prompts, params)]


PROMPTS = [random_tokens(n, seed=n) for n in (3, 11, 26, 41)]


def test_int8_engine_answers_as_the_dequantized_checkpoint_eager_chunked_and_compiled(model_dirs):
    built_cpu_kernels()
    expected = tokens(make_llm(model_dirs["dequantized"]), PROMPTS)
    for overrides in (dict(), dict(max_num_batched_tokens=8, max_num_seqs=4), dict(compile="on")):
        llm = make_llm(model_dirs["plain"], weight_dtype="int8", **overrides)
        layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, Int8Linear)]
        assert len(layers) == 3 * 4 + 1, overrides  # four linears a layer and the LM head
        assert not any(type(m) is nn.Linear for m in llm.engine.runner.model.modules())
        assert all(m.weight.dtype == torch.int8 for m in layers)
        assert tokens(llm, PROMPTS) == expected, overrides


def test_a_mixture_keeps_its_router_in_the_models_dtype(tmp_path):
    from tests.cloud_engine.tiny_models import save_tiny_llama

    built_cpu_kernels()
    llm = make_llm(save_tiny_llama(tmp_path, qwen3_moe_config()), weight_dtype="int8")
    routers = [m for name, m in llm.engine.runner.model.named_modules() if name.endswith("mlp.gate")]
    assert routers and all(type(m) is nn.Linear and m.weight.dtype == torch.float32 for m in routers)
    assert len(tokens(llm, PROMPTS[:2], 4)[0]) == 4


def test_a_draft_model_takes_the_targets_int8_weights(model_dirs):
    from cloud_engine.spec_decode import SpeculativeConfig

    built_cpu_kernels()
    spec = SpeculativeConfig(method="draft", draft_model=model_dirs["plain"], num_speculative_tokens=3)
    llm = make_llm(model_dirs["plain"], weight_dtype="int8", speculative=spec)
    draft = llm.engine.speculator.proposer.runner.model
    assert isinstance(draft.head_linear, Int8Linear)
    assert tokens(llm, PROMPTS) == tokens(make_llm(model_dirs["plain"], weight_dtype="int8"), PROMPTS)
    assert llm.engine.speculator.stats.num_drafts > 0
