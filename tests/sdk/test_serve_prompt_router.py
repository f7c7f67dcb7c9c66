"""Issue 52, item 7, done when: `tandem serve` with TANDEM_CASCADE_PROMPT_ROUTER=default and no other
routing setting escalates the share docs/benchmarks.md states (half of the design tables' prompts before
generation: tests/sdk/test_prompt_router_default.py checks the figure itself), not every prompt.
The real command on loopback, the official `openai` client, model "auto"."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from router.eval_tables import load_routellm
from router.prompt_router.locked_split import design_examples
from router.prompt_router.scorer import load_scorer
from tests.conftest import running_server

pytestmark = pytest.mark.slow

NUM_PROMPTS = 20


def stratified_design_prompts() -> tuple[list[str], np.ndarray]:
    """NUM_PROMPTS design prompts at evenly spaced places of the shipped router's order (the middle
    of each twentieth), and their scores: half of them rank in the design tables' top half."""
    prompts = [e.prompt for e in design_examples(load_routellm())]
    scores = load_scorer().score(prompts)
    order = np.argsort(scores, kind="stable")
    picked = order[((np.arange(NUM_PROMPTS) + 0.5) / NUM_PROMPTS * len(prompts)).astype(int)]
    return [prompts[i] for i in picked], scores[picked]


def test_tandem_serve_with_the_default_router_escalates_half_the_design_prompts_not_all(tmp_path):
    prompts, scores = stratified_design_prompts()
    args = ["serve", "--max-model-len", "1024", "--kv-cache-tokens", "4096", "--threads", "1", "--log-level", "warning"]
    # only engine flags beside it (sizes for these machines); no routing setting but the router
    env = {"TANDEM_CASCADE_PROMPT_ROUTER": "default"}  # running_server drops every other TANDEM_* variable
    with running_server(args, tmp_path / "server.log", extra_env=env) as (_, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)

        def before_generation(prompt: str) -> bool:
            messages = [{"role": "user", "content": prompt}]
            reply = client.chat.completions.create(model="auto", messages=messages, max_tokens=1, temperature=0)
            info = reply.model_extra["tandem"]
            return info["reason"] == "prompt_router" and info["escalated"] and info["tier"] == "cloud"

        escalated = np.array([before_generation(p) for p in prompts])
        assert not before_generation("hi")
    assert escalated.sum() == NUM_PROMPTS // 2, (escalated, scores)
    np.testing.assert_array_equal(escalated, 1 - scores < 0.5)  # the top half by the shipped router's order
