"""llama-cpp-python's high-level `Llama`, loaded the way tandem loads models, as a reference."""

from __future__ import annotations

import contextlib


def load_reference_llama(model_path: str, **kwargs):
    """A `Llama` with tandem's kernel settings: flash attention on, quiet, and llama.cpp's extra
    (repacked) buffer types off as tandem's local engine loads them (LocalEngineConfig.extra_buffer_types)."""
    import llama_cpp

    kwargs.setdefault("flash_attn", True)
    kwargs.setdefault("verbose", False)
    with without_extra_buffer_types():
        llama = llama_cpp.Llama(model_path, **kwargs)
    if llama.model_params.use_extra_bufts:
        raise RuntimeError("the reference Llama still uses extra buffer types; the patch missed")
    return llama


@contextlib.contextmanager
def without_extra_buffer_types():
    """While active, models llama-cpp-python loads skip the extra (repacked) buffer types. The
    high-level API has no switch for them, and `Llama` reads the defaults through the
    `llama_cpp.llama_cpp` module (the package only re-exports them), so both are patched."""
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    original = low_level.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    low_level.llama_model_default_params = llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        low_level.llama_model_default_params = llama_cpp.llama_model_default_params = original


def reference_greedy(llama, prompt_token_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation through the high-level API (its own sampler, top_k=1)."""
    llama.reset()
    out = []
    for token in llama.generate(prompt_token_ids, top_k=1, temp=0.0, reset=True):
        out.append(token)
        if len(out) == max_tokens:
            break
    return out
