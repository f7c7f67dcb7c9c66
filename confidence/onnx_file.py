"""A tandem ONNX file: a graph run by onnxruntime, with a JSON document under one key of its
metadata_props. The confidence probe (confidence.probe_runtime) and the prompt router
(router.prompt_router.scorer) are such files; this is what opening and checking them shares.

onnxruntime is imported where a session is opened, not at the top: `tandem serve` imports the
prompt router before /health can answer, and only a configured router opens a session
(~0.1-0.25 s on 2 cores otherwise)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime


@dataclass(frozen=True)
class OnnxFileFormat:
    """One kind of tandem ONNX file, and the words its refusals use."""

    noun: str  # what messages call the file: "probe", "router"
    description: str  # what a file without the metadata is not: "a tandem probe"
    metadata_key: str  # the metadata_props key holding the JSON document
    format_version: int  # the document's format_version this tandem reads
    version_note: str  # said after the version this tandem reads ("" for nothing)
    retrain_hint: str  # how to get a file this tandem reads, ending the refusal of another version
    required_keys: tuple[str, ...]  # keys every document has, beside format_version
    format_error: type[ValueError]  # what refuses a file of the wrong form


def default_providers() -> list[str]:
    """CUDA first when this onnxruntime build offers it, CPU always as the fallback."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def open_session(
    path: str | os.PathLike, file_format: OnnxFileFormat, providers=None, threads: int | None = 1
) -> onnxruntime.InferenceSession:
    """An onnxruntime session over the file at `path`; FileNotFoundError when there is none,
    file_format.format_error when it is not ONNX. threads=1 by default: a probe or a router
    is milliseconds on one core and the local LLM beside it wants the others (None:
    onnxruntime's default)."""
    import onnxruntime

    path = os.fspath(path)
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return onnxruntime.InferenceSession(path, options, providers=providers or default_providers())
    except Exception as exc:  # onnxruntime raises its own, unexported exception types
        if not os.path.exists(path):
            raise FileNotFoundError(f"no {file_format.noun} file at {path}") from exc
        raise file_format.format_error(f"{path} is not a loadable ONNX model: {exc}") from exc


def read_metadata_document(session: onnxruntime.InferenceSession, path: str, file_format: OnnxFileFormat):
    """The parsed JSON document the file keeps under file_format.metadata_key (not yet checked)."""
    raw = session.get_modelmeta().custom_metadata_map.get(file_format.metadata_key)
    if raw is None:
        raise file_format.format_error(
            f"{path} has no {file_format.metadata_key!r} metadata; it is not {file_format.description}"
        )
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise file_format.format_error(f"{path}: {file_format.noun} metadata is not valid JSON: {exc}") from exc


def check_document_header(document, file_format: OnnxFileFormat) -> None:
    """What every kind checks first: a JSON object, of the version this tandem reads, with every required key."""
    noun, error = file_format.noun, file_format.format_error
    if not isinstance(document, dict):
        raise error(f"{noun} metadata must be a JSON object, got {type(document).__name__}")
    version = document.get("format_version")
    if version != file_format.format_version:
        raise error(
            f"{noun} format_version {version!r} is not supported (this tandem reads "
            f"{file_format.format_version}{file_format.version_note}); {file_format.retrain_hint}"
        )
    missing = [key for key in file_format.required_keys if key not in document]
    if missing:
        raise error(f"{noun} metadata lacks {missing}")
