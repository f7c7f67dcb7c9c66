"""Workloads for bench.serve: (prompt, prompt length, output length) triples, seeded.

* random: prompts of random common English words aimed at a token length, output
  lengths drawn the same way (vLLM's --random-range-ratio: uniform in
  [len * (1 - r), len * (1 + r)]).
* gsm8k: GSM8K questions, each with the length of the recorded Mixtral-8x7B answer
  from RouteLLM's data (capped) as its output length.
* mmlu: MMLU questions from RouteLLM's 38 subjects; the files record correctness but
  no answers, so every request gets one fixed output length.

Token counts come from a GGUF tokenizer when one is given (llama.cpp, vocabulary only:
loads in ~0.1 s); otherwise they are estimates: one token per word of the random word
list (each is a single token, with its leading space, in GPT-2-style BPE vocabularies
such as SmolLM2's), and characters / 4 for dataset text. bench.serve counts chat prompts
through the GGUF's chat template when it has the tokenizer; servers that report usage
overwrite the prompt count with their own.
"""

from __future__ import annotations

import csv
import ctypes
import glob
import os
import random
from dataclasses import dataclass

DEFAULT_DATA_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "data", "routellm"
)
GSM8K_FILE = "gsm8k_responses.csv"
GSM8K_RESPONSE_COLUMN = "mistralai/Mixtral-8x7B-Instruct-v0.1_response"  # the weak model: closest to a local answer
CHARS_PER_TOKEN = 4  # estimate for English text when no tokenizer is given
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there would their we him been has when who will more no if out so said what up its about "
    "than into them can only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work long "
    "get here between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three"
).split()


@dataclass
class SampleRequest:
    """One request of a workload."""

    prompt: str
    prompt_len: int  # tokens, measured with the tokenizer or estimated (see prompt_len_source)
    output_len: int  # max_tokens sent (and the fixed length asked for with ignore_eos)


def _quiet_llama_logs(llama_cpp) -> None:
    """llama.cpp logs every loading step to stderr; keep its warnings and errors only."""
    if getattr(_quiet_llama_logs, "callback", None) is not None:
        return

    @llama_cpp.llama_log_callback
    def _log(level, text, user_data):
        if level in (3, 4):  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            os.write(2, text)

    _quiet_llama_logs.callback = _log  # the C side keeps only a pointer: keep the object alive
    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))


class GgufTokenizer:
    """A GGUF file's tokenizer through llama.cpp's low-level API: vocabulary only, no weights, no context.
    Tokenizing and token texts are the local engine's own (local_runtime.llama_vocabulary)."""

    def __init__(self, model_path: str):
        import llama_cpp

        from local_runtime.llama_vocabulary import LlamaVocabulary

        self.model_path = model_path
        llama_cpp.llama_backend_init()
        _quiet_llama_logs(llama_cpp)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
        if not model:
            raise ValueError(f"llama.cpp could not read a tokenizer from {model_path} (is it a GGUF file?)")
        self._vocab = LlamaVocabulary(llama_cpp, model)
        self.chat_template = self._vocab.metadata("tokenizer.chat_template")

    def count_chat(self, prompt: str) -> int:
        """Tokens of `prompt` as a user message through the model's chat template (as a server counts them)."""
        from sdk.engine_common.chat_template import render_chat

        vocab = self._vocab
        bos = vocab.special_token_text("bos")
        text = render_chat(
            self.chat_template, [{"role": "user", "content": prompt}], bos, vocab.special_token_text("eos")
        )
        add_bos = vocab.adds_bos and not (bos and text.startswith(bos))
        return len(vocab.tokenize(text, add_bos, parse_special=True))

    def encode(self, text: str) -> list[int]:
        return self._vocab.tokenize(text, add_special=False, parse_special=False)

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self._vocab.token_bytes(t) for t in token_ids).decode("utf-8", errors="ignore")

    def count(self, text: str) -> int:
        return len(self.encode(text))


def _length_range(mean: int, range_ratio: float) -> tuple[int, int]:
    if mean < 1:
        raise ValueError(f"lengths must be >= 1, got {mean}")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    return max(1, round(mean * (1 - range_ratio))), max(1, round(mean * (1 + range_ratio)))


def random_requests(
    num: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    tokenizer: GgufTokenizer | None = None,
) -> list[SampleRequest]:
    """Prompts of random words aimed at `input_len` tokens; distinct prompts, so no prefix is shared."""
    in_low, in_high = _length_range(input_len, range_ratio)
    out_low, out_high = _length_range(output_len, range_ratio)
    rng = random.Random(seed)
    samples = []
    for _ in range(num):
        target = rng.randint(in_low, in_high)
        words = [rng.choice(WORDS) for _ in range(target)]
        prompt, prompt_len = " ".join(words), target
        if tokenizer is not None:
            # Trim to the target in tokens; decoding and encoding again may move the count by a token.
            prompt = tokenizer.decode(tokenizer.encode(prompt)[:target]).strip()
            prompt_len = tokenizer.count(prompt)
        samples.append(SampleRequest(prompt, prompt_len, rng.randint(out_low, out_high)))
    return samples


def _count(text: str, tokenizer: GgufTokenizer | None) -> int:
    return tokenizer.count(text) if tokenizer is not None else max(1, round(len(text) / CHARS_PER_TOKEN))


def _pick(rows: list, num: int, seed: int) -> list:
    """`num` rows in a seeded random order, cycling when more are asked for than exist."""
    if not rows:
        raise ValueError("the dataset is empty")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[order[i % len(order)]] for i in range(num)]


def _require(path: str) -> str:
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found; pass --data-dir pointing at RouteLLM's data (../shared/data/routellm)"
        )
    return path


def gsm8k_requests(
    num: int,
    seed: int = 0,
    max_output_len: int = 256,
    tokenizer: GgufTokenizer | None = None,
    data_dir: str = DEFAULT_DATA_DIR,
) -> list[SampleRequest]:
    """GSM8K questions; output length = the recorded Mixtral answer's length, capped at `max_output_len`."""
    with open(_require(os.path.join(data_dir, GSM8K_FILE)), newline="", encoding="utf-8") as f:
        rows = [(row["prompt"], row[GSM8K_RESPONSE_COLUMN]) for row in csv.DictReader(f)]
    return [
        SampleRequest(prompt, _count(prompt, tokenizer), max(1, min(max_output_len, _count(answer, tokenizer))))
        for prompt, answer in _pick(rows, num, seed)
    ]


def mmlu_requests(
    num: int,
    seed: int = 0,
    output_len: int = 32,
    tokenizer: GgufTokenizer | None = None,
    data_dir: str = DEFAULT_DATA_DIR,
) -> list[SampleRequest]:
    """MMLU questions from every subject file, each asking for `output_len` tokens."""
    prompts = []
    for path in sorted(glob.glob(os.path.join(_require(os.path.join(data_dir, "mmlu")), "mmlu_*.csv"))):
        with open(path, newline="", encoding="utf-8") as f:
            prompts.extend(row["prompt"] for row in csv.DictReader(f))
    return [SampleRequest(prompt, _count(prompt, tokenizer), output_len) for prompt in _pick(prompts, num, seed)]
