"""llama-cpp-python's high-level `Llama`, loaded the way tandem loads models, as a reference."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def _without_extra_buffer_types():
    # The high-level API has no switch for use_extra_bufts, and the AMX/repacked buffer
    # types crash llama_decode on these CPUs; patch the default params while it loads.
    import llama_cpp

    original = llama_cpp.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        llama_cpp.llama_model_default_params = original


def load_reference_llama(model_path: str, **kwargs):
    """A `Llama` with tandem's kernel settings (flash attention on, quiet)."""
    import llama_cpp

    kwargs.setdefault("flash_attn", True)
    kwargs.setdefault("verbose", False)
    with _without_extra_buffer_types():
        return llama_cpp.Llama(model_path, **kwargs)


def reference_greedy(llama, prompt_token_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation through the high-level API (its own sampler, top_k=1)."""
    llama.reset()
    out = []
    for token in llama.generate(prompt_token_ids, top_k=1, temp=0.0, reset=True):
        out.append(token)
        if len(out) == max_tokens:
            break
    return out
