"""The local engine fills in its tier's sampling defaults for fields a request leaves out (real model)."""

from __future__ import annotations

import pytest

from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.local_runtime.conftest import make_engine


@pytest.mark.slow
def test_unset_fields_take_the_configured_then_the_models_defaults():
    engine = make_engine(sampling={"top_k": 7})
    try:
        assert {k: engine.sampling_defaults.values[k] for k in ("temperature", "top_p", "top_k")} == {
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 7,
        }
        prompt = engine.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
        engine.add_request(GenerationRequest("unset", prompt, SamplingParams(max_tokens=4)))
        engine.add_request(GenerationRequest("own", prompt, SamplingParams(max_tokens=4, temperature=1.0, top_p=1.0)))
        unset, own = engine.scheduler.requests["unset"].params, engine.scheduler.requests["own"].params
        assert (unset.temperature, unset.top_p, unset.top_k) == (0.2, 0.9, 7)
        assert (own.temperature, own.top_p, own.top_k) == (1.0, 1.0, 7)
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.close()
