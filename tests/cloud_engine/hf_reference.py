"""transformers as the reference for real GGUF files: its own loader, its own forward."""

from __future__ import annotations

import os

import torch


def transformers_greedy(gguf_path: str, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (token ids) from the GGUF file, in float32, EOS ignored."""
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outs = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=num_tokens, do_sample=False, pad_token_id=0)
            outs.append(out[0, len(prompt) :].tolist())
    return outs
