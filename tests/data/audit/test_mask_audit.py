"""The mask audit: supervised tokens counted and marked, truncation and drops, one audit per source of a mixture."""

from __future__ import annotations

import json

from hf_lora_ds.data.audit.mask_audit import audit_by_source, audit_dataset
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.data.sources import load_data

RECORDS = [
    {"instruction": "12=", "output": "王大丫丫的回答是--->3 + 9"},
    {"instruction": "1=", "output": "0 + 1"},
    {
        "messages": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour!"},
            {"role": "user", "content": "Tell me a joke"},
            {"role": "assistant", "content": "cats."},
        ]
    },
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
    """At a limit 3 tokens short of sample 0: sample 0 loses the end of its answer (a cut span), the short sample 1
    is untouched, multi-turn sample 2 keeps its first answer whole and loses the second, and sample 3, whose long
    prompt pushes its whole answer past the limit, is left with no supervised token and dropped."""
    records = [*RECORDS, {"instruction": "12=" * 20, "output": "3 + 9"}]
    full = ChatSFTDataset(records, chatml_tokenizer, cache_dir=tmp_path)
    limit = len(full[0]["input_ids"]) - 3  # cuts the answer before its end-of-turn token
    first_supervised = [next(i for i, label in enumerate(s["labels"]) if label != -100) for s in full]
    assert len(full[1]["input_ids"]) <= limit < first_supervised[3]  # the cases described above, as built

    truncated = ChatSFTDataset(records, chatml_tokenizer, max_length=limit, cache_dir=tmp_path)
    report = audit_dataset(truncated)
    assert (report.samples, report.truncated, report.dropped_empty) == (3, 3, 1)
    assert (report.spans, report.spans_ending_in_eot, report.spans_cut_by_truncation) == (3, 2, 1)
    sample_one = sum(label != -100 for label in full[1]["labels"])
    assert report.supervised_max == limit - first_supervised[0] and report.supervised_min == sample_one
    assert "3 truncated, 1 dropped with no supervised token" in report.line()
    assert "(1 cut by truncation)" in report.line()


def write_records(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_audit_per_source_of_a_mixture(chatml_tokenizer, tmp_path):
    """Source b's one ShareGPT sample has a prompt so long that, at a limit a's samples fit in, its answers are cut
    off entirely: the overall audit counts it dropped, the per-source audits say which source it came from."""
    a = write_records(tmp_path / "a.jsonl", RECORDS[:2])
    long_prompt = {"conversations": [{"from": "human", "value": "12=" * 20}, {"from": "gpt", "value": "3 + 9"}]}
    b = write_records(tmp_path / "b.jsonl", [long_prompt])
    data = load_data(f"{a}:2,{b}:1", seed=0)
    full = ChatSFTDataset(data, chatml_tokenizer, cache_dir=tmp_path)
    assert {name: audit.spans for name, audit in audit_by_source(full).items()} == {a: 2, b: 1}
    limit = max(len(full[i]["input_ids"]) for i, name in enumerate(full.sources) if name == a)
    cut = ChatSFTDataset(data, chatml_tokenizer, max_length=limit, cache_dir=tmp_path)
    overall, per_source = audit_dataset(cut), audit_by_source(cut)
    assert (overall.samples, overall.dropped_empty, overall.truncated) == (2, 1, 1)
    assert list(per_source) == [a]  # b kept no sample, so it has no audit of its own
    assert (per_source[a].samples, per_source[a].dropped_empty, per_source[a].truncated) == (2, 0, 0)
    assert (cut.dropped_by_source[b], cut.truncated_by_source[b]) == (1, 1)


def test_audit_counts_what_training_flags_switched(chatml_tokenizer, tmp_path):
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour!", "weight": 0},
        {"role": "user", "content": "Tell me a joke"},
        {"role": "assistant", "content": "cats."},
    ]
    report = audit_dataset(ChatSFTDataset([*RECORDS, {"messages": messages}], chatml_tokenizer, cache_dir=tmp_path))
    assert report.flags_line() == (
        "training flags: 1 turns switched off, 0 switched on; 0 tokens masked inside "
        "located turns, 0 trained in turns only the flags train"
    )
    assert report.flags_line() in report.line() and report.flags_line() in str(report)
    assert audit_dataset(ChatSFTDataset(RECORDS, chatml_tokenizer, cache_dir=tmp_path)).flags_line() is None
