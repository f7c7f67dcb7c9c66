"""The learned parts a cascade may use, loaded from CascadeConfig's paths:

- the confidence probe (confidence.probe_runtime, ONNX): scores the running local answer
  in place of `score_kind` (during generation, or once at the end with decide_at="end");
  a probe trained for another model than the local engine's is refused;
- the prompt router (router.prompt_router, ONNX): scores the prompt before generation.

Imported only when a config names one, so a cascade without them needs no onnxruntime.
"""

from __future__ import annotations

from sdk.protocol.engine import EngineProtocol


def load_local_probe(path: str, local_engine: EngineProtocol):
    """The probe at `path`, checked against the GGUF the local engine runs."""
    from confidence.gguf_fingerprint import model_fingerprint_for_gguf
    from confidence.probe_runtime import load_probe

    model_path = local_engine.model_path  # read once: the local engine resolves (and checks) the file each time
    if model_path is None:
        raise ValueError("a confidence probe needs a local engine that runs a GGUF file (its fingerprint is checked)")
    return load_probe(path, model_fingerprint_for_gguf(model_path))


def load_prompt_scorer(spec: str):
    """ "default" (the shipped router) or the path of a `tandem router train` file."""
    from router.prompt_router import load_scorer

    return load_scorer(None if spec == "default" else spec)
