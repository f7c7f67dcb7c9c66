"""The prompt router: scores a prompt's need for the cloud tier before the local model
generates, and learns from an app's own labelled traffic.

Device side (numpy, onnxruntime; tokenizers once it has learned from traffic):
`load_scorer()` -> PromptScorer, whose `scorer(prompt)` is the `score_fn` of
router.pre_generation.PromptRouterPolicy. The cold start reads the prompt's shape
(prompt_shape); a router trained from traffic adds a topic correction over MiniLM
embeddings (topic_correction). Training (training, cross_validation) is numpy plus, for
the MiniLM export, torch and transformers once per machine.
"""

from router.prompt_router.scorer import (
    PromptScorer,
    RouterError,
    RouterFormatError,
    RouterModelMismatchError,
    RouterOutputs,
    load_scorer,
)

__all__ = [
    "PromptScorer",
    "RouterError",
    "RouterFormatError",
    "RouterModelMismatchError",
    "RouterOutputs",
    "load_scorer",
]
