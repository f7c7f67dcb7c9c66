"""The embedding model behind a server: loaded on first use on a thread (the loop keeps
serving; a first export takes ~20 s, a cached one about a second), then every call runs
on a thread, one at a time."""

from __future__ import annotations

import asyncio

from sdk.protocol.openai_schema.embeddings import EMBEDDING_MODEL_ID, EMBEDDING_WINDOW


class EmbeddingService:
    model_id = EMBEDDING_MODEL_ID
    window = EMBEDDING_WINDOW  # tokens, [CLS] and [SEP] included

    def __init__(self, threads: int | None = None, loader=None):
        self.threads = threads
        self._loader = loader
        self._model = None  # sdk.embeddings.model.EmbeddingModel (onnxruntime is imported with it, on first use)
        self._loading: asyncio.Lock | None = None

    async def model(self):
        if self._model is None:
            if self._loading is None:
                self._loading = asyncio.Lock()
            async with self._loading:
                if self._model is None:
                    self._model = await asyncio.to_thread(self._load)
        return self._model

    def _load(self):
        if self._loader is None:
            from sdk.embeddings.model import EmbeddingModel

            self._loader = EmbeddingModel
        return self._loader(self.threads)

    async def embed(self, texts: list[str], truncate: bool = False):
        """sdk.embeddings.model.Embeddings of `texts` (InvalidRequestError names a bad input)."""
        model = await self.model()
        return await asyncio.to_thread(model.embed, texts, truncate)

    async def tokenize(self, text: str) -> list[int]:
        model = await self.model()
        return model.tokenizer.encode(text).ids

    async def detokenize(self, token_ids: list[int]) -> str:
        model = await self.model()
        return model.tokenizer.decode(token_ids, skip_special_tokens=True)
