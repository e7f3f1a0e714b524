"""evaluate() and score_predictions(): accuracy bookkeeping, token budget, and sharded runs equal to one process."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.data.records import DataError
from hf_lora_ds.eval import Generation, evaluate, evaluator, score_predictions
from hf_lora_ds.eval.evaluator import EXTRA_TOKENS


def test_result_is_consistent_with_its_predictions(varied_model, qwen_style_tokenizer, sum_records):
    result = evaluate(varied_model, qwen_style_tokenizer, sum_records, "sum_to_x", batch_size=4)
    assert result.num_samples == len(sum_records) == len(result.predictions)
    assert [p.index for p in result.predictions] == list(range(len(sum_records)))
    assert [p.reference for p in result.predictions] == [r["output"] for r in sum_records]
    for p, record in zip(result.predictions, sum_records):
        assert p.prompt.endswith(f"{record['instruction']}<|im_end|>\n<|im_start|>assistant\n")
    assert result.accuracy == result.num_correct / result.num_samples
    assert sum(result.reasons.values()) == result.num_samples - result.num_correct
    assert result.generated_tokens == sum(p.num_tokens for p in result.predictions) > 0
    assert result.generated_tokens_per_s == pytest.approx(result.generated_tokens / result.generation_time_s)
    assert 0 < result.generation_time_s <= result.total_time_s
    assert result.peak_host_rss_bytes > 0
    assert result.peak_accelerator_bytes is None  # the model is on the CPU
    assert result.world_size == 1


def test_token_budget_is_the_longest_reference_plus_room(varied_model, qwen_style_tokenizer, sum_records):
    tokens = qwen_style_tokenizer([r["output"] for r in sum_records], add_special_tokens=False)["input_ids"]
    budget = max(map(len, tokens)) + 1 + EXTRA_TOKENS
    result = evaluate(varied_model, qwen_style_tokenizer, sum_records, "sum_to_x")
    assert all(p.num_tokens == budget for p in result.predictions if not p.stopped)
    assert all(p.num_tokens <= budget for p in result.predictions)
    short = evaluate(varied_model, qwen_style_tokenizer, sum_records, "sum_to_x", max_new_tokens=3)
    assert max(p.num_tokens for p in short.predictions) == 3


def test_accuracy_counts_what_the_task_scores(monkeypatch, tiny_model, qwen_style_tokenizer, sum_records):
    """With generation replaced by known completions, accuracy and reasons must follow exactly."""
    by_prompt = {}
    for i, record in enumerate(sum_records):
        prompt = qwen_style_tokenizer.apply_chat_template(
            [{"role": "user", "content": record["instruction"]}], tokenize=False, add_generation_prompt=True
        )
        by_prompt[prompt] = record["output"] if i % 3 else record["output"] + " !"

    def fake_generate(model, tokenizer, prompts, **kwargs):
        return [Generation(by_prompt[p], 5, True) for p in prompts]

    monkeypatch.setattr(evaluator, "generate", fake_generate)
    result = evaluate(tiny_model, qwen_style_tokenizer, sum_records, "sum_to_x")
    wrong = len(range(0, len(sum_records), 3))
    assert result.num_correct == len(sum_records) - wrong
    assert result.reasons == {"extra text": wrong}


def test_sharded_across_two_ranks_equals_one_process(monkeypatch, varied_model, qwen_style_tokenizer, sum_records):
    """Run rank 1 then rank 0 in this process with a fake process group; the merged result must equal one process's."""
    single = evaluate(varied_model, qwen_style_tokenizer, sum_records, "sum_to_x", batch_size=3)

    class Captured(Exception):
        pass

    payloads, prompt_counts = {}, {}
    real_generate = evaluator.generate

    def counting_generate(model, tokenizer, prompts, **kwargs):
        prompt_counts[rank] = len(prompts)
        return real_generate(model, tokenizer, prompts, **kwargs)

    def fake_gather_from_ranks(obj):
        payloads[rank] = obj
        if rank == 1:
            raise Captured
        return [payloads[0], payloads[1]]

    monkeypatch.setattr(evaluator, "generate", counting_generate)
    monkeypatch.setattr(evaluator, "gather_from_ranks", fake_gather_from_ranks)
    for rank in (1, 0):
        monkeypatch.setattr(evaluator, "rank_and_world", lambda rank=rank: (rank, 2))
        try:
            sharded = evaluate(varied_model, qwen_style_tokenizer, sum_records, "sum_to_x", batch_size=3)
        except Captured:
            continue
    assert prompt_counts == {0: 7, 1: 7}  # 13 records: 7 + 6, rank 1 topped up with a duplicate
    assert sharded.predictions == single.predictions
    assert (sharded.accuracy, sharded.reasons, sharded.world_size) == (single.accuracy, single.reasons, 2)
    assert sharded.generated_tokens == single.generated_tokens


def test_score_predictions(tmp_path):
    path = tmp_path / "preds.jsonl"
    p = "王大丫丫的回答是--->"
    rows = [
        {"instruction": "5=", "input": "", "output": f"{p}1 + 4", "prediction": f"{p}2 + 3"},
        {"instruction": "5=", "input": "", "output": f"{p}1 + 4", "prediction": "1 + 4"},
        {"instruction": "9=", "input": "", "output": f"{p}1 + 8", "prediction": f"{p}4 + 4"},
    ]
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = score_predictions(path, "sum_to_x")
    assert [p.correct for p in result.predictions] == [True, False, False]
    assert result.reasons == {"no prefix": 1, "wrong sum": 1}
    assert result.predictions[2].where == f"{path}, line 3"
    assert result.generated_tokens is None

    path.write_text(lines[0] + "\n" + lines[1].replace('"prediction"', '"pred"') + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}, line 2: field 'prediction' is missing"):
        score_predictions(path, "sum_to_x")
