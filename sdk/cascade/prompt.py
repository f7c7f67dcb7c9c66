"""What one cascade request asks the tiers to continue: chat messages, or a raw prompt (/v1/completions).

The cascade's flow (route, stream, hand off, fall back) is the same for both; what differs is here:
the text the privacy rules and the prompt router read, how the prompt is redacted before it leaves
the device, the local engine's token ids for it, and what the cloud is sent.

- `ChatPrompt`: messages, rendered by each tier's own chat template; redaction rewrites each text.
- `RawPrompt`: text or token ids continued as they are (a base model has no template). Text is
  sent to the cloud as text (a tandem.v1 server tokenizes it with its BOS, as the local tier does),
  so a hand-off by restart works across vocabularies. Token ids mean something only in the local
  vocabulary: the cloud gets them only when it shares it (CascadeRunner.vocabulary_verdict), and they
  cannot be redacted without changing them, so a privacy rule that matches their text keeps them local.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.chat_text import iter_message_texts, message_as_dict, message_text_length
from router.privacy import PrivacyRules, PrivacyVerdict, Redaction
from sdk.protocol.engine import ContextLengthError, EngineProtocol, InvalidRequestError
from sdk.serving.prompt_tokens import chat_prompt_tokens, text_prompt_tokens


class ChatPrompt:
    """Chat messages (dicts, or the SDK's message models)."""

    is_raw = False
    redactable = True

    def __init__(self, messages: Sequence):
        self.messages = [message_as_dict(message) for message in messages]
        # The texts the privacy rules read (string contents and "text" content parts), one string.
        self.text = "\n".join(text for _, _, text in iter_message_texts(self.messages))

    @property
    def text_length(self) -> int:
        return message_text_length(self.messages)

    def verdict(self, rules: PrivacyRules, private: bool) -> PrivacyVerdict:
        return rules.check_messages(self.messages, private=private)

    def redacted(self, rules: PrivacyRules) -> tuple[list[dict], list[Redaction]]:
        """What the cloud is sent with every match replaced, and the replacements."""
        return rules.redact_messages(self.messages)

    def unredacted(self) -> list[dict]:
        return self.messages

    async def local_tokens(self, engine: EngineProtocol, cloud_prompt=None) -> list[int]:
        """The local engine's token ids for this prompt (or for `cloud_prompt`, what the cloud is sent)."""
        return await chat_prompt_tokens(engine, self.messages if cloud_prompt is None else cloud_prompt)


class RawPrompt:
    """A /v1/completions prompt: text, or token ids in the local model's vocabulary."""

    is_raw = True

    def __init__(self, text: str, token_ids: list[int] | None = None):
        self.text = text
        self.token_ids = token_ids  # None: a text prompt
        self.redactable = token_ids is None

    @classmethod
    def of(cls, engine: EngineProtocol, prompt: str | Sequence[int]) -> RawPrompt:
        """From a request's prompt; token ids are checked against the local vocabulary and read back as
        text for the privacy rules (InvalidRequestError naming `prompt` for an id out of range)."""
        if isinstance(prompt, str):
            return cls(prompt)
        token_ids = [int(token) for token in prompt]
        max_model_len = engine.max_model_len
        if max_model_len and len(token_ids) >= max_model_len:  # before reading a hostile list back as text
            raise ContextLengthError(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{len(token_ids)} tokens, which leaves no room for a completion. Please reduce the prompt.",
                "prompt",
            )
        vocab_size = engine.vocab_size
        if vocab_size is not None:
            bad = next((token for token in token_ids if not 0 <= token < vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(f"prompt token id {bad} is out of range [0, {vocab_size})", "prompt")
        return cls(engine.detokenize(token_ids), token_ids)

    @property
    def text_length(self) -> int:
        return len(self.text)

    def verdict(self, rules: PrivacyRules, private: bool) -> PrivacyVerdict:
        return rules.check(self.text, private=private)

    def redacted(self, rules: PrivacyRules) -> tuple[str | list[int], list[Redaction]]:
        if self.token_ids is not None:  # not redactable: the request's verdict keeps a match local
            return self.token_ids, []
        return rules.redact(self.text)

    def unredacted(self) -> str | list[int]:
        return self.text if self.token_ids is None else self.token_ids

    async def local_tokens(self, engine: EngineProtocol, cloud_prompt=None) -> list[int]:
        prompt = self.unredacted() if cloud_prompt is None else cloud_prompt
        if isinstance(prompt, str):
            return await text_prompt_tokens(engine, prompt)  # with the model's BOS, as /v1/completions
        return list(prompt)


CascadePrompt = ChatPrompt | RawPrompt
