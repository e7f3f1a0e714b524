"""Eval fixtures: a tiny model whose greedy outputs differ from prompt to prompt, and sum-to-x records.

A freshly initialised model (std 0.02) repeats one token for every prompt, so "batched equals one-by-one" would
pass even with prompts swapped. Larger random weights make each prompt's completion distinct; a larger
end-of-turn embedding makes about half the completions stop early, so stopping and padding after the stop are
exercised too.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_lora_ds.tiny import build_tiny_qwen2


def make_varied_model(tokenizer, std: float = 0.5, eos_scale: float = 1.5, seed: int = 0):
    model = build_tiny_qwen2(tokenizer, hidden_size=32, num_hidden_layers=2)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
        model.get_input_embeddings().weight[tokenizer.eos_token_id] *= eos_scale
    return model.eval()


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine two threads waiting on each
    other made the same eval ~40x slower (22 s instead of 0.5 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def varied_model(qwen_style_tokenizer):
    return make_varied_model(qwen_style_tokenizer)


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory, qwen_style_tokenizer):
    path = tmp_path_factory.mktemp("varied-model")
    make_varied_model(qwen_style_tokenizer).save_pretrained(path)
    qwen_style_tokenizer.save_pretrained(path)
    return path


def sum_record(x: int, a: int, prompt_repeat: int = 1) -> dict[str, str]:
    """A sum-to-x record; ``prompt_repeat`` lengthens the instruction (x stays the last ``{x}=``) to vary lengths."""
    return {"instruction": f"{x}=" * prompt_repeat, "input": "", "output": f"王大丫丫的回答是--->{a} + {x - a}"}


@pytest.fixture
def sum_records() -> list[dict[str, str]]:
    return [sum_record(10 + 7 * i, 1 + i % 9, 1 + i % 4) for i in range(13)]


@pytest.fixture
def sum_records_file(tmp_path, sum_records):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(sum_records, ensure_ascii=False, indent=1), encoding="utf-8")
    return path
