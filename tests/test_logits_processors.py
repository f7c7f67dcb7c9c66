"""The samplers' penalties, bias, min_tokens and min_p on both tiers (numpy on the device, torch
in the cloud), pinned against transformers' LogitsProcessors and OpenAI's documented formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from cloud_engine import logits_processors as cloud
from cloud_engine.sampler import make_generator
from cloud_engine.sampler import sample_batch as cloud_sample_batch
from local_runtime import logits_processors as local
from local_runtime.sampler import sample_batch as local_sample_batch
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.sampling_defaults import OPENAI_SAMPLING

VOCAB = 64
END_IDS = [2, 3]


def params(**fields) -> SamplingParams:
    return OPENAI_SAMPLING.apply(SamplingParams(max_tokens=32, **fields))


def history(seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(4, VOCAB, 12)], [int(t) for t in rng.integers(4, VOCAB, 9)]


def row_logits(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * 3).astype(np.float32)


def both_tiers(
    logits: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    on_device = local.apply_logit_changes(logits, p, prompt, output, np.array(END_IDS))
    in_cloud = cloud.apply_logit_changes(torch.from_numpy(logits)[None], [p], [(prompt, output)], END_IDS)[0].numpy()
    return on_device, in_cloud


def openai_penalties(logits: np.ndarray, output: list[int], presence: float, frequency: float) -> np.ndarray:
    """OpenAI's formula, token by token: mu[j] - c[j] * frequency - (c[j] > 0) * presence."""
    expected = logits.astype(np.float64).copy()
    for token_id in set(output):
        count = output.count(token_id)
        expected[token_id] -= count * frequency + presence
    return expected


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty):
    prompt, output = history(1)
    logits = row_logits(2)
    reference = RepetitionPenaltyLogitsProcessor(penalty)(
        torch.tensor([prompt + output]), torch.from_numpy(logits)[None].double()
    )
    for got in both_tiers(logits, params(repetition_penalty=penalty), prompt, output):
        np.testing.assert_allclose(got, reference[0].numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("presence", "frequency"), [(0.6, 0.0), (0.0, 0.4), (-1.0, 2.0)])
def test_presence_and_frequency_penalties_follow_openai_over_generated_tokens_only(presence, frequency):
    prompt, output = history(3)
    output += output[:4]  # some tokens several times
    logits = row_logits(4)
    expected = openai_penalties(logits, output, presence, frequency)
    for got in both_tiers(logits, params(presence_penalty=presence, frequency_penalty=frequency), prompt, output):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)
    only_in_prompt = sorted(set(prompt) - set(output))
    assert only_in_prompt and np.allclose(expected[only_in_prompt], logits[only_in_prompt])


def test_logit_bias_matches_transformers_sequence_bias():
    bias = {5: 3.5, 17: -100.0, 40: 0.25}
    logits = row_logits(5)
    prompt, output = history(6)
    reference = SequenceBiasLogitsProcessor({(k,): v for k, v in bias.items()})(
        torch.tensor([prompt + output]), torch.from_numpy(logits)[None].double()
    )
    for got in both_tiers(logits, params(logit_bias=bias), prompt, output):
        np.testing.assert_allclose(got, reference[0].numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_masks_end_and_stop_tokens_until_reached(ignore_eos):
    prompt, output = history(7)
    logits = row_logits(8)
    p = params(min_tokens=len(output) + 1, stop_token_ids=[9], ignore_eos=ignore_eos)
    reference = MinNewTokensLengthLogitsProcessor(len(prompt), p.min_tokens, END_IDS + [9])(
        torch.tensor([prompt + output]), torch.from_numpy(logits)[None].double()
    )[0].numpy()
    if ignore_eos:  # end tokens end nothing then: only the stop token ids are held back
        reference[END_IDS] = logits[END_IDS]
    for got in both_tiers(logits, p, prompt, output):
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(reference))
    reached = params(min_tokens=len(output), stop_token_ids=[9])
    for got in both_tiers(logits, reached, prompt, output):
        assert np.isfinite(got).all()


def test_min_tokens_under_ignore_eos_changes_logits_only_with_stop_token_ids():
    """A fixed-length request (ignore_eos + min_tokens, as benchmark clients send) has nothing to
    hold back, so the samplers skip its per-row logits copy; stop_token_ids still get masked."""
    assert not params(min_tokens=5, ignore_eos=True).changes_logits
    assert params(min_tokens=5, ignore_eos=True, stop_token_ids=[9]).changes_logits
    assert params(min_tokens=5).changes_logits
    prompt, output = history(3)
    logits = row_logits(11)
    logits[END_IDS[0]] = logits.max() + 5.0  # the end token is the greedy pick
    p = params(min_tokens=10, ignore_eos=True, temperature=0.0)
    picked = local_sample_batch(
        logits[None].copy(), [p], [np.random.default_rng(0)], [(prompt, output)], np.array(END_IDS)
    )
    assert picked[0].token_id == END_IDS[0]  # under ignore_eos an end token is an ordinary token


@pytest.mark.parametrize("min_p", [0.05, 0.3])
def test_min_p_after_temperature_matches_transformers(min_p):
    scaled = row_logits(9).astype(np.float64) / 0.7
    reference = MinPLogitsWarper(min_p)(None, torch.from_numpy(scaled)[None])[0].numpy()
    kept_on_device = np.zeros(VOCAB, dtype=bool)
    kept_on_device[local.min_p_candidates(scaled, min_p)] = True
    np.testing.assert_array_equal(kept_on_device, ~np.isneginf(reference))
    on_cloud = cloud.min_p_filter(torch.from_numpy(scaled.astype(np.float32)), min_p).numpy()
    np.testing.assert_array_equal(np.isneginf(on_cloud), np.isneginf(reference))


def test_every_change_at_once_agrees_between_the_tiers():
    prompt, output = history(10)
    p = params(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3, logit_bias={6: 2.0}, min_tokens=20)
    on_device, in_cloud = both_tiers(row_logits(11), p, prompt, output)
    np.testing.assert_allclose(on_device, in_cloud, rtol=1e-5, atol=1e-5)


def test_greedy_picks_follow_the_changes_while_signals_stay_the_models_own():
    logits = np.zeros((1, VOCAB), dtype=np.float32)
    logits[0, 7], logits[0, 8] = 5.0, 4.0
    prompt, output = [4, 5], [7, 7]
    p = params(temperature=0.0, frequency_penalty=1.0)  # 5 - 2 x 1 = 3 < 4: token 8 wins
    on_device = local_sample_batch(logits, [p], [np.random.default_rng(0)], [(prompt, output)], np.array(END_IDS))[0]
    in_cloud = cloud_sample_batch(
        torch.from_numpy(logits), [p], [make_generator(0, torch.device("cpu"))], [(prompt, output)], END_IDS
    )[0]
    raw_logprob_of_8 = float(torch.log_softmax(torch.from_numpy(logits[0]).double(), -1)[8])
    for token in (on_device, in_cloud):
        assert token.token_id == 8 and token.logprob == pytest.approx(raw_logprob_of_8, abs=1e-5)


def test_penalized_sampling_is_reproducible_per_seed_on_both_tiers():
    logits = np.stack([row_logits(s) for s in range(4)])
    p = params(temperature=0.9, top_p=0.95, min_p=0.02, repetition_penalty=1.3, presence_penalty=0.4, seed=3)
    histories = [history(s) for s in range(4)]

    def local_run(seed):
        rngs = [np.random.default_rng(seed + i) for i in range(4)]
        return [
            [t.token_id for t in local_sample_batch(logits, [p] * 4, rngs, histories, np.array(END_IDS))]
            for _ in range(5)
        ]

    def cloud_run(seed):
        generators = [make_generator(seed + i, torch.device("cpu")) for i in range(4)]
        return [
            [t.token_id for t in cloud_sample_batch(torch.from_numpy(logits), [p] * 4, generators, histories, END_IDS)]
            for _ in range(5)
        ]

    assert local_run(1) == local_run(1) and cloud_run(1) == cloud_run(1)
    assert local_run(1) != local_run(2) and cloud_run(1) != cloud_run(2)


def test_min_p_sampling_never_picks_below_the_threshold_on_either_tier():
    logits = row_logits(12)[None]
    p = params(temperature=1.0, min_p=0.2, top_k=40, top_p=0.99)
    scaled = logits[0].astype(np.float64)
    allowed = set(np.flatnonzero(scaled >= scaled.max() + np.log(0.2)).tolist())
    rng, generator = np.random.default_rng(0), make_generator(0, torch.device("cpu"))
    picks = {local_sample_batch(logits, [p], [rng])[0].token_id for _ in range(300)}
    picks |= {cloud_sample_batch(torch.from_numpy(logits), [p], [generator])[0].token_id for _ in range(300)}
    assert picks <= allowed and len(picks) > 1
