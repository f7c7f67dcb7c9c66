"""A router file's ONNX graph, built node by node with onnx.helper (opset 17, ops every
onnxruntime build has, mobile included).

    shape [n, k] -> MatMul/Add (the linear head, standardization folded) -> [n, 2]
    (learned from traffic: + embedding [n, 384] -> MatMul/Add, the topic correction)
    -> tier_correct [n, 2]
    gain = tier_correct[:, 1] - tier_correct[:, 0]            [n]
    score = the gain on its score scale (score_scale):        [n]
            sum(rise * Clip((Clip(gain, -1, 1) - start) / width, 0, 1)) over the scale's pieces

A router with a topic correction carries the MiniLM export too (merged, so the file is the whole
scorer): its inputs are then input_ids, attention_mask and shape, and `embedding` is an
output as well (the traffic record keeps it).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from router.prompt_router.embedder_export import EMBEDDING_DIM, EMBEDDING_OUTPUT, OPSET
from router.prompt_router.linear_head import LinearHead
from router.prompt_router.score_scale import ScoreScale
from router.prompt_router.topic_correction import TopicCorrection

SHAPE_INPUT = "shape"
TIER_OUTPUT, GAIN_OUTPUT, SCORE_OUTPUT = "tier_correct", "gain", "score"
IR_VERSION = 8


def _tensor(name: str, array, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name=name)


def build_router_graph(
    head: LinearHead, correction: TopicCorrection | None, scale: ScoreScale, metadata: dict
) -> onnx.ModelProto:
    """The head (and topic correction) alone: inputs shape (and embedding)."""
    weight, bias = head.folded()
    start, width, rise = scale.segments()
    initializers = [
        _tensor("head_weight", weight),
        _tensor("head_bias", bias),
        _tensor("gain_direction", [[-1.0], [1.0]]),
        _tensor("zero", 0.0),
        _tensor("one", 1.0),
        _tensor("minus_one", -1.0),
        _tensor("flat", [-1], np.int64),
        _tensor("column", [1], np.int64),
        _tensor("scale_start", start),
        _tensor("scale_width", width),
        _tensor("scale_rise", rise[:, None]),
    ]
    nodes = [
        helper.make_node("MatMul", [SHAPE_INPUT, "head_weight"], ["head_product"]),
        helper.make_node("Add", ["head_product", "head_bias"], ["head_correct"]),
    ]
    inputs = [helper.make_tensor_value_info(SHAPE_INPUT, TensorProto.FLOAT, ["batch", weight.shape[0]])]
    if correction is not None:
        inputs.append(helper.make_tensor_value_info(EMBEDDING_OUTPUT, TensorProto.FLOAT, ["batch", EMBEDDING_DIM]))
        initializers += [_tensor("topic_weight", correction.weight), _tensor("topic_bias", correction.bias)]
        nodes += [
            helper.make_node("MatMul", [EMBEDDING_OUTPUT, "topic_weight"], ["topic_product"]),
            helper.make_node("Add", ["topic_product", "topic_bias"], ["topic_correction"]),
            helper.make_node("Add", ["head_correct", "topic_correction"], [TIER_OUTPUT]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["head_correct"], [TIER_OUTPUT]))
    nodes += [
        helper.make_node("MatMul", [TIER_OUTPUT, "gain_direction"], ["gain_column"]),
        helper.make_node("Reshape", ["gain_column", "flat"], [GAIN_OUTPUT]),
        helper.make_node("Clip", [GAIN_OUTPUT, "minus_one", "one"], ["bounded_gain"]),
        helper.make_node("Unsqueeze", ["bounded_gain", "column"], ["gain_rows"]),  # [n, 1]
        helper.make_node("Sub", ["gain_rows", "scale_start"], ["past_start"]),  # [n, pieces]
        helper.make_node("Div", ["past_start", "scale_width"], ["piece_position"]),
        helper.make_node("Clip", ["piece_position", "zero", "one"], ["piece_done"]),
        helper.make_node("MatMul", ["piece_done", "scale_rise"], ["scaled_column"]),  # [n, 1]
        helper.make_node("Reshape", ["scaled_column", "flat"], ["scaled"]),
        helper.make_node("Clip", ["scaled", "zero", "one"], [SCORE_OUTPUT]),  # float32 sums may stray by an ulp
    ]
    outputs = [
        helper.make_tensor_value_info(SCORE_OUTPUT, TensorProto.FLOAT, ["batch"]),
        helper.make_tensor_value_info(GAIN_OUTPUT, TensorProto.FLOAT, ["batch"]),
        helper.make_tensor_value_info(TIER_OUTPUT, TensorProto.FLOAT, ["batch", 2]),
    ]
    graph = helper.make_graph(nodes, "tandem_prompt_router", inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tandem.prompt_router",
    )
    onnx.checker.check_model(model, full_check=True)
    return set_metadata(model, metadata)


def merge_embedder(embedder: onnx.ModelProto, router: onnx.ModelProto, metadata: dict) -> onnx.ModelProto:
    """One graph: input_ids, attention_mask, shape -> score, gain, tier_correct, embedding."""
    if router.ir_version != embedder.ir_version:  # merge_models insists on equal IR versions
        router = onnx.ModelProto.FromString(router.SerializeToString())
        router.ir_version = embedder.ir_version
    merged = onnx.compose.merge_models(
        embedder,
        router,
        io_map=[(EMBEDDING_OUTPUT, EMBEDDING_OUTPUT)],
        outputs=[SCORE_OUTPUT, GAIN_OUTPUT, TIER_OUTPUT, EMBEDDING_OUTPUT],
        producer_name="tandem.prompt_router",
    )
    return set_metadata(merged, metadata)


def set_metadata(model: onnx.ModelProto, document: dict) -> onnx.ModelProto:
    from router.prompt_router.scorer import METADATA_KEY, validate_router_metadata

    del model.metadata_props[:]  # an embedder's own document: replaced by the router's
    helper.set_model_props(model, {METADATA_KEY: json.dumps(validate_router_metadata(document), allow_nan=False)})
    return model
