"""The probe as an ONNX graph, built node by node with onnx.helper (no torch.onnx, so the
export does not depend on torch's exporter and the graph holds only ops every
onnxruntime build, mobile included, has).

    features [n, d] float32
      -> Where(IsNaN(x), mean, x)        missing features become the training mean
      -> Min(Max(x, low), high)          clip to the training range (±inf included)
      -> (x - mean) / std                standardization learned on the training split
      -> MatMul/Add (-> Relu -> MatMul/Add for "mlp")
      -> logit [n], probability = Sigmoid(logit) [n]   (uncalibrated)"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT_NAME = "features"
LOGIT_OUTPUT = "logit"
PROBABILITY_OUTPUT = "probability"
# Opset 17 / IR 8: old enough for onnxruntime builds of the last few years (Android AARs
# included), new enough for everything used here.
OPSET = 17
IR_VERSION = 8


def _constant(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name=name)


def logistic_stack(
    input_name: str,
    layers: list[tuple[np.ndarray, np.ndarray]],
    logit_name: str,
    probability_name: str,
    prefix: str = "",
) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """Initializers and nodes of input -> affine layers (ReLU between) -> logit [n] -> Sigmoid.

    `layers` holds (weight [in, out], bias [out]) with one output unit in the last; `prefix`
    keeps the names apart when the graph is merged with another (the prompt router's head)."""
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    hidden = input_name
    for index, (weight, bias) in enumerate(layers):
        initializers += [_constant(f"{prefix}weight_{index}", weight), _constant(f"{prefix}bias_{index}", bias)]
        nodes += [
            helper.make_node("MatMul", [hidden, f"{prefix}weight_{index}"], [f"{prefix}product_{index}"]),
            helper.make_node("Add", [f"{prefix}product_{index}", f"{prefix}bias_{index}"], [f"{prefix}affine_{index}"]),
        ]
        hidden = f"{prefix}affine_{index}"
        if index < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [hidden], [f"{prefix}relu_{index}"]))
            hidden = f"{prefix}relu_{index}"
    initializers.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), name=f"{prefix}flat_shape"))
    nodes += [
        helper.make_node("Reshape", [hidden, f"{prefix}flat_shape"], [logit_name]),
        helper.make_node("Sigmoid", [logit_name], [probability_name]),
    ]
    return initializers, nodes


def build_probe_model(
    preprocessing: dict[str, np.ndarray], layers: list[tuple[np.ndarray, np.ndarray]]
) -> onnx.ModelProto:
    """ONNX model of the probe.

    `preprocessing` holds per-feature float arrays "mean", "std", "low", "high" (shape
    [d]); `layers` holds (weight [in, out], bias [out]) per affine layer, with ReLU
    between consecutive layers and one output unit in the last."""
    num_features = preprocessing["mean"].shape[0]
    initializers = [_constant(f"pre_{key}", preprocessing[key]) for key in ("mean", "std", "low", "high")]
    nodes = [
        helper.make_node("IsNaN", [INPUT_NAME], ["is_missing"]),
        helper.make_node("Where", ["is_missing", "pre_mean", INPUT_NAME], ["imputed"]),
        helper.make_node("Max", ["imputed", "pre_low"], ["raised"]),
        helper.make_node("Min", ["raised", "pre_high"], ["clipped"]),
        helper.make_node("Sub", ["clipped", "pre_mean"], ["centered"]),
        helper.make_node("Div", ["centered", "pre_std"], ["standardized"]),
    ]
    stack_initializers, stack_nodes = logistic_stack("standardized", layers, LOGIT_OUTPUT, PROBABILITY_OUTPUT)
    initializers += stack_initializers
    nodes += stack_nodes
    graph = helper.make_graph(
        nodes,
        "tandem_confidence_probe",
        inputs=[helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["num_rows", num_features])],
        outputs=[
            helper.make_tensor_value_info(LOGIT_OUTPUT, TensorProto.FLOAT, ["num_rows"]),
            helper.make_tensor_value_info(PROBABILITY_OUTPUT, TensorProto.FLOAT, ["num_rows"]),
        ],
        initializer=initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tandem.confidence",
    )
    onnx.checker.check_model(model, full_check=True)
    return model
