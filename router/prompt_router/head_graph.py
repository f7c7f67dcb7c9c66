"""The router head as ONNX, built with onnx.helper (the probe's logistic_stack), and its
merge with the MiniLM export into one whole-scorer file.

    embedding [n, 384] -> MatMul/Add (-> Relu -> MatMul/Add for "mlp") -> logit [n]
    score = Sigmoid(logit) [n]
Standardization learned on the training embeddings is folded into the first layer."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from confidence.probe_graph import logistic_stack
from router.prompt_router.embedder_export import EMBEDDING_OUTPUT, OPSET
from router.prompt_router.scorer import LOGIT_OUTPUT, METADATA_KEY, SCORE_OUTPUT, validate_router_metadata


def build_head_model(layers: list[tuple[np.ndarray, np.ndarray]], metadata: dict, ir_version: int = 8) -> onnx.ModelProto:
    """`layers`: (weight [in, out], bias [out]) per affine layer, ReLU between, 1 output unit."""
    initializers, nodes = logistic_stack(EMBEDDING_OUTPUT, layers, LOGIT_OUTPUT, SCORE_OUTPUT, prefix="head_")
    graph = helper.make_graph(
        nodes, "tandem_prompt_router_head",
        inputs=[helper.make_tensor_value_info(EMBEDDING_OUTPUT, TensorProto.FLOAT, ["batch", layers[0][0].shape[0]])],
        outputs=[helper.make_tensor_value_info(LOGIT_OUTPUT, TensorProto.FLOAT, ["batch"]),
                 helper.make_tensor_value_info(SCORE_OUTPUT, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=ir_version, producer_name="tandem.prompt_router"
    )
    onnx.checker.check_model(model, full_check=True)
    _set_metadata(model, {**metadata, "kind": "head"})
    return model


def merge_scorer(embedder: onnx.ModelProto, head: onnx.ModelProto, metadata: dict) -> onnx.ModelProto:
    """One graph: input_ids, attention_mask -> logit, score (the embedding wired into the head)."""
    if head.ir_version != embedder.ir_version:  # merge_models insists on equal IR versions
        head = onnx.ModelProto.FromString(head.SerializeToString())
        head.ir_version = embedder.ir_version
    merged = onnx.compose.merge_models(
        embedder, head, io_map=[(EMBEDDING_OUTPUT, EMBEDDING_OUTPUT)], outputs=[LOGIT_OUTPUT, SCORE_OUTPUT],
        producer_name="tandem.prompt_router",
    )  # fmt: skip
    del merged.metadata_props[:]  # the embedder's and head's own documents: replaced by one
    _set_metadata(merged, {**metadata, "kind": "scorer"})
    return merged


def _set_metadata(model: onnx.ModelProto, document: dict) -> None:
    document = validate_router_metadata(document)
    helper.set_model_props(model, {METADATA_KEY: json.dumps(document, allow_nan=False)})
