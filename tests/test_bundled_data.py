"""The bundled demo data and base model that the default ``run_sft.py`` job uses are present and consistent."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SUM_DIR = DATA_DIR / "sum_to_x"
MODEL_DIR = DATA_DIR / "tiny-qwen2-sum"
PREFIX = "王大丫丫的回答是--->"
ANSWER_RE = re.compile(re.escape(PREFIX) + r"(\d+) \+ (\d+)")


def _load(name: str) -> list[dict]:
    return json.loads((SUM_DIR / f"{name}.json").read_text(encoding="utf-8"))


def _x_values(records: list[dict]) -> set[int]:
    return {int(r["instruction"].removesuffix("=")) for r in records}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.mark.parametrize("name", ["train", "eval"])
def test_records_are_alpaca_with_correct_prefixed_sums(name):
    records = _load(name)
    assert isinstance(records, list) and records
    for record in records:
        assert set(record) == {"instruction", "input", "output"}
        assert record["input"] == ""
        assert re.fullmatch(r"\d+=", record["instruction"]), record
        match = ANSWER_RE.fullmatch(record["output"])
        assert match, record
        assert int(match[1]) + int(match[2]) == int(record["instruction"][:-1]), record


def test_eval_x_values_are_held_out_from_train():
    train_xs, eval_xs = _x_values(_load("train")), _x_values(_load("eval"))
    assert len(eval_xs) == len(_load("eval")), "one eval record per held-out x"
    assert not train_xs & eval_xs


def test_files_match_what_the_generator_writes():
    """The committed files are reproducible: the generator's defaults still write exactly them."""
    spec = importlib.util.spec_from_file_location("make_sum_to_x", DATA_DIR.parent / "scripts" / "make_sum_to_x.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    train, evaluation = module.make_splits()
    assert train == _load("train")
    assert evaluation == _load("eval")


def test_tokenizer_splits_digits_and_ends_turns_with_im_end(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    ids = tokenizer(f"{PREFIX}7 + 1203", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["7", "1", "2", "0", "3"]
    assert tokenizer.decode(ids) == f"{PREFIX}7 + 1203"


def test_chat_template_injects_default_system_prompt(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "12="}], add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\n12=<|im_end|>\n<|im_start|>assistant\n")


def test_model_loads_as_small_qwen2_that_stops_at_im_end(tokenizer):
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    generation_config = GenerationConfig.from_pretrained(MODEL_DIR)
    assert generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation_config.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
