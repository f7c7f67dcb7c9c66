"""Issue 52, item 7: `cascade.prompt_router = "default"` with nothing else set escalates the share of
prompts docs/benchmarks.md states (bench.router_learning's `prompt_router_default_cut`), not all of them: the
settings a `tandem serve` reads, the runner it builds, the policies each request composes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.decision import RoutingMode, parse_model_choice
from router.eval_tables import load_routellm
from router.prompt_router.locked_split import design_examples, locked_examples
from sdk.cascade.request import CascadeRequest
from sdk.cascade.runner import CascadeRunner
from sdk.protocol.engine import SamplingParams
from sdk.settings import load_settings

FIGURES = Path(__file__).resolve().parents[2] / "bench" / "results" / "router_learning.json"


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> CascadeRunner:
    home = tmp_path_factory.mktemp("home")  # no config file: built-in defaults and this one variable
    settings = load_settings(None, env={"HOME": str(home), "TANDEM_CASCADE_PROMPT_ROUTER": "default"})
    # no engines: only the decision before generation is asked for, which runs none
    return CascadeRunner(local=None, cloud=None, config=settings.cascade_config())


def escalated_before_generation(runner: CascadeRunner, prompts: list[str]) -> np.ndarray:
    """Whether each prompt, sent with model "auto", goes to the cloud before the local model runs."""
    mode, threshold = parse_model_choice("auto")
    assert mode is RoutingMode.AUTO and threshold is None  # the runner fills in its default, as generate() does
    out = []
    for number, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt}]
        threshold = runner.config.default_threshold
        request = CascadeRequest(runner, messages, SamplingParams(max_tokens=8), mode, threshold, False, f"r{number}")
        decision = request.cascade.before_generation(request.context)
        out.append(decision is not None and decision.tier.value == "cloud")
        if decision is not None and decision.tier.value == "cloud":
            assert decision.decided_by == "prompt_router"
    return np.array(out)


def test_the_default_router_with_nothing_else_set_escalates_the_documented_share(runner):
    documented = json.loads(FIGURES.read_text())["prompt_router_default_cut"]
    assert runner.config.prompt_router_threshold is None and documented["threshold"] == runner.config.default_threshold
    examples = load_routellm()
    for name, rows in (("design", design_examples(examples)), ("locked", locked_examples(examples))):
        share = escalated_before_generation(runner, [e.prompt for e in rows]).mean()
        # the bench asks PromptRouterPolicy alone; here privacy rules come first and keep a few prompts local
        assert share == pytest.approx(documented[name]["cloud_share"], abs=0.005), name
    assert documented["design"]["cloud_share"] == pytest.approx(0.5, abs=0.01)  # the threshold is the design share


def test_short_chat_prompts_stay_local_and_a_request_threshold_moves_the_cut(runner):
    chat = ["hi", "What is the capital of France?", "Thanks! Can you say that again, shorter?"]
    assert not escalated_before_generation(runner, chat).any()
    scores = runner.prompt_scorer.score([e.prompt for e in design_examples(load_routellm())])
    for threshold in (0.1, 0.3, 0.8):  # auto:<t>: the top t of the design prompts (prompts of one length go together)
        assert abs(np.mean(1 - scores < threshold) - threshold) < 0.01, threshold
