from __future__ import annotations

import json

from hf_lora_ds.audit import audit_dataset, main
from hf_lora_ds.data import ChatSFTDataset

RECORDS = [
    {"instruction": "12=", "output": "王大丫丫的回答是--->3 + 9"},
    {"instruction": "1=", "output": "0 + 1"},
    {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Bonjour!"},
                  {"role": "user", "content": "Tell me a joke"}, {"role": "assistant", "content": "cats."}]},
]


def test_audit_counts_and_marks_supervision(chatml_tokenizer, tmp_path):
    report = audit_dataset(ChatSFTDataset(RECORDS, chatml_tokenizer, cache_dir=tmp_path))
    assert report.samples == 3 and report.truncated == 0 and report.dropped_empty == 0
    assert report.spans == 4 and report.spans_ending_in_eot == 4 and report.all_spans_end_in_eot
    assert report.supervised_min == len(chatml_tokenizer("0 + 1<|im_end|>", add_special_tokens=False)["input_ids"])
    assert report.example == (
        "<|im_start|>user\n12=<|im_end|>\n<|im_start|>assistant\n[[王大丫丫的回答是--->3 + 9<|im_end|>]]\n"
    )
    assert "4/4 spans end in the end-of-turn token" in report.line()


def test_audit_reports_truncation_and_dropped_samples(chatml_tokenizer, tmp_path):
    full = ChatSFTDataset(RECORDS[:1], chatml_tokenizer, cache_dir=tmp_path)[0]
    limit = len(full["input_ids"]) - 3  # cuts the answer before its end-of-turn token
    report = audit_dataset(ChatSFTDataset(RECORDS, chatml_tokenizer, max_length=limit, cache_dir=tmp_path))
    assert report.truncated >= 1
    assert report.spans_cut_by_truncation >= 1
    assert report.spans_ending_in_eot + report.spans_cut_by_truncation == report.spans
    assert "cut by truncation" in report.line()


def test_audit_cli(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in RECORDS))
    report = main(["--data", str(data), "--tokenizer", str(tiny_model_dir)])
    out = capsys.readouterr().out
    assert "samples:                          3" in out and "[[" in out
    assert report.spans == 4
