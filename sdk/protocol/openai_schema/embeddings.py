"""POST /v1/embeddings: OpenAI's request and response shapes.

`input` is a string or a list of strings (at most MAX_INPUTS). Token-id arrays, which OpenAI
also takes, are refused naming `input`: the ids would be another tokenizer's (OpenAI's
cl100k), not this model's. `dimensions` is refused (the model has one size, 384).
`truncate` (extension): embed the first 256 tokens of a longer input instead of refusing it.
Other fields follow request_fields like chat's: `user` is accepted and ignored, unknown names
are ignored with a warning (refused with --strict-fields)."""

from __future__ import annotations

import base64
from typing import Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationInfo, model_validator

from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.request_fields import classify_extra_fields, refuse_unknown_fields

MAX_INPUTS = 2048
EMBEDDING_MODEL_ID = "all-MiniLM-L6-v2"  # the one embedding model tandem serves (sdk.embeddings)
EMBEDDING_WINDOW = 256  # its window in tokens, [CLS] and [SEP] included (sentence-transformers' max_seq_length)


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    _ignored_fields: list[str] = PrivateAttr(default_factory=list)

    model: str | None = None  # None: the one embedding model
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None  # accepted for compatibility; not used
    truncate: bool | None = False  # extension (tandem): cut inputs longer than the window instead of refusing them

    @model_validator(mode="after")
    def _refuse_what_tandem_does_not_do(self, info: ValidationInfo):
        texts = self.texts  # raises for token arrays, empty lists and too many inputs
        del texts
        if self.dimensions is not None:
            raise InvalidRequestError(
                "dimensions is not supported: all-MiniLM-L6-v2 has one size, 384; leave it out", "dimensions"
            )
        ignored = (["user"] if self.user is not None else []) + classify_extra_fields(self.model_extra or {})
        refuse_unknown_fields(ignored, bool((info.context or {}).get("strict_fields")))
        self._ignored_fields = ignored
        return self

    @property
    def texts(self) -> list[str]:
        values = [self.input] if isinstance(self.input, str) else list(self.input)
        if not values:
            raise InvalidRequestError("input must not be empty", "input")
        if any(not isinstance(value, str) for value in values):
            raise InvalidRequestError(
                "input must be a string or a list of strings: token ids belong to a tokenizer (OpenAI's are not "
                "this model's), so send the text",
                "input",
            )
        if len(values) > MAX_INPUTS:
            raise InvalidRequestError(f"input holds {len(values)} texts; at most {MAX_INPUTS} per request", "input")
        return values

    @property
    def ignored_fields(self) -> list[str]:
        return list(self._ignored_fields)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]  # base64: the little-endian float32 bytes, as OpenAI sends them


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    tandem: dict[str, Any] | None = None  # extension: the request fields accepted but ignored

    @classmethod
    def of(
        cls, vectors: np.ndarray, num_tokens: list[int], model: str, encoding_format: str, ignored_fields: list[str]
    ) -> EmbeddingResponse:
        def encode(vector: np.ndarray):
            if encoding_format == "base64":
                return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
            return [float(x) for x in vector]

        data = [EmbeddingData(index=i, embedding=encode(vector)) for i, vector in enumerate(vectors)]
        total = int(sum(num_tokens))
        return cls(
            data=data,
            model=model,
            usage=EmbeddingUsage(prompt_tokens=total, total_tokens=total),
            tandem={"ignored_fields": ignored_fields} if ignored_fields else None,
        )
