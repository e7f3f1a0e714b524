"""Exact label vectors: built here from hand-written string pieces, independent of how data.py derives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_lora_ds.data import dataset
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.data.records import DataError

ANSWER = "王大丫丫的回答是--->3 + 9"
MULTI_TURN = {
    "messages": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour!"},
        {"role": "user", "content": "Tell me a joke"},
        {"role": "assistant", "content": "cats."},
    ]
}


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def expected(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Token ids and labels of a text given as (piece, trained?) pairs."""
    input_ids, labels = [], []
    for text, trained in pieces:
        piece = ids(tokenizer, text)
        input_ids += piece
        labels += piece if trained else [IGNORE_INDEX] * len(piece)
    return input_ids, labels


def build(records, tokenizer, tmp_path, **kwargs):
    return ChatSFTDataset(records, tokenizer, cache_dir=tmp_path, **kwargs)


def test_alpaca_plain_chatml(chatml_tokenizer, tmp_path):
    ds = build([{"instruction": "12=", "input": "", "output": ANSWER}], chatml_tokenizer, tmp_path)
    want_ids, want_labels = expected(
        chatml_tokenizer,
        [
            ("<|im_start|>user\n12=<|im_end|>\n<|im_start|>assistant\n", False),
            (ANSWER + "<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert ds[0]["input_ids"] == want_ids
    assert ds[0]["labels"] == want_labels
    assert ds[0]["attention_mask"] == [1] * len(want_ids)


def test_alpaca_input_is_joined_with_newline_and_default_system_injected(qwen_style_tokenizer, tmp_path):
    ds = build([{"instruction": "Add", "input": "12=", "output": ANSWER}], qwen_style_tokenizer, tmp_path)
    want_ids, want_labels = expected(
        qwen_style_tokenizer,
        [
            ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", False),
            ("<|im_start|>user\nAdd\n12=<|im_end|>\n<|im_start|>assistant\n", False),
            (ANSWER + "<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert (ds[0]["input_ids"], ds[0]["labels"]) == (want_ids, want_labels)


@pytest.mark.parametrize("turns", ["all", "last"])
def test_multi_turn_messages(qwen_style_tokenizer, tmp_path, turns):
    ds = build([MULTI_TURN], qwen_style_tokenizer, tmp_path, assistant_turns=turns)
    want_ids, want_labels = expected(
        qwen_style_tokenizer,
        [
            ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n", False),
            ("<|im_start|>assistant\n", False),
            ("Bonjour!<|im_end|>", turns == "all"),
            ("\n<|im_start|>user\nTell me a joke<|im_end|>\n<|im_start|>assistant\n", False),
            ("cats.<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert (ds[0]["input_ids"], ds[0]["labels"]) == (want_ids, want_labels)


def test_end_of_turn_trained_headers_and_pads_never(qwen_style_tokenizer, tmp_path):
    ds = build([MULTI_TURN], qwen_style_tokenizer, tmp_path)
    tok = qwen_style_tokenizer
    trained = [label for label in ds[0]["labels"] if label != IGNORE_INDEX]
    assert trained.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2
    assert tok.convert_tokens_to_ids("<|im_start|>") not in trained
    assert tok.pad_token_id not in trained


def test_system_prompt_argument_and_record_system(chatml_tokenizer, tmp_path):
    records = [
        {"instruction": "1=", "output": "0 + 1"},
        {"instruction": "1=", "output": "0 + 1", "system": "Own system."},
    ]
    ds = build(records, chatml_tokenizer, tmp_path, system_prompt="Be brief.")
    texts = [chatml_tokenizer.decode(s["input_ids"]) for s in ds]
    assert texts[0].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1=")
    assert texts[1].startswith("<|im_start|>system\nOwn system.<|im_end|>\n")


def test_truncation_keeps_partial_answer(chatml_tokenizer, tmp_path):
    full = build([{"instruction": "12=", "output": ANSWER}], chatml_tokenizer, tmp_path)[0]
    cut = len(full["input_ids"]) - 3
    ds = build([{"instruction": "12=", "output": ANSWER}], chatml_tokenizer, tmp_path, max_length=cut)
    assert ds.num_truncated == 1
    assert ds[0]["input_ids"] == full["input_ids"][:cut]
    assert ds[0]["labels"] == full["labels"][:cut]


def test_truncation_to_zero_supervised_tokens_drops_or_raises(chatml_tokenizer, tmp_path):
    records = [{"instruction": "12=", "output": ANSWER}, {"instruction": "1=", "output": "0 + 1"}]
    prompt_len = len(ids(chatml_tokenizer, "<|im_start|>user\n12=<|im_end|>\n<|im_start|>assistant\n"))
    ds = build(records, chatml_tokenizer, tmp_path, max_length=prompt_len)
    assert ds.num_dropped == 1 and len(ds) == 1
    assert ds[0]["input_ids"][: prompt_len - 1] == ids(
        chatml_tokenizer, "<|im_start|>user\n1=<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(DataError, match=r"record 0: sample 0 has no supervised token .*max_length"):
        build(records, chatml_tokenizer, tmp_path, max_length=prompt_len, on_empty_labels="error")


def test_tokenized_samples_are_cached(chatml_tokenizer, tmp_path):
    records = [{"instruction": "12=", "output": ANSWER}]
    build(records, chatml_tokenizer, tmp_path)
    cached = list(tmp_path.glob("chat_sft-*.arrow"))
    assert len(cached) == 1
    build(records, chatml_tokenizer, tmp_path)
    assert list(tmp_path.glob("chat_sft-*.arrow")) == cached
    build(
        records,
        chatml_tokenizer,
        tmp_path,
        max_length=len(ids(chatml_tokenizer, "<|im_start|>user\n12=<|im_end|>\n<|im_start|>assistant\n")) + 2,
    )
    assert len(list(tmp_path.glob("chat_sft-*.arrow"))) == 2


def test_the_cache_key_hashes_every_module_of_the_data_package_its_formats_included(monkeypatch):
    """A changed record format (hf_lora_ds/data/formats/) must not reuse the samples an older one tokenized."""
    read = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: read.append(path.name) or read_bytes(path))
    dataset._code_version()
    assert {"alpaca.py", "turns.py", "registry.py", "dataset.py", "labels.py"} <= set(read)


def _with_template(tokenizer, template):
    clone = tokenizer.__class__(
        tokenizer_object=tokenizer.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )
    return clone


def test_template_that_rewrites_content_is_refused(chatml_tokenizer, tmp_path):
    stripping = chatml_tokenizer.chat_template.replace("message['content']", "message['content'] | trim")
    tokenizer = _with_template(chatml_tokenizer, stripping)
    with pytest.raises(TemplateError, match="changes the content of assistant turn 1"):
        build([{"instruction": "1=", "output": "0 + 1  "}], tokenizer, tmp_path)


def test_template_without_end_of_turn_token_is_refused(chatml_tokenizer, tmp_path):
    plain = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="never learn to stop"):
        build([{"instruction": "1=", "output": "0 + 1"}], _with_template(chatml_tokenizer, plain), tmp_path)


def test_template_that_rewrites_history_trains_each_turn_in_its_own_text(chatml_tokenizer, tmp_path):
    # Like Qwen3's template: earlier assistant turns are rendered differently (here: emptied) once the conversation
    # goes on, so each turn is trained in the text that ends with it, as inference prompts it.
    history = (
        "{%- for m in messages %}{%- if m['role'] == 'assistant' and not loop.last %}"
        "{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}{%- else %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tokenizer = _with_template(chatml_tokenizer, history)
    ds = build([MULTI_TURN], tokenizer, tmp_path)
    first = [
        ("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", False),
        ("Bonjour!<|im_end|>", True),
        ("\n", False),
    ]
    second = [
        (
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
            "<|im_start|>user\nTell me a joke<|im_end|>\n<|im_start|>assistant\n",
            False,
        ),
        ("cats.<|im_end|>", True),
        ("\n", False),
    ]
    assert [(ds[i]["input_ids"], ds[i]["labels"]) for i in range(len(ds))] == [
        expected(tokenizer, first),
        expected(tokenizer, second),
    ]
    last = build([MULTI_TURN], tokenizer, tmp_path, assistant_turns="last")
    assert len(last) == 1 and (last[0]["input_ids"], last[0]["labels"]) == expected(tokenizer, second)


def test_file_inputs_json_jsonl_parquet(chatml_tokenizer, tmp_path):
    import json

    import datasets

    records = [{"instruction": "12=", "output": ANSWER}, MULTI_TURN]
    (tmp_path / "d.json").write_text(json.dumps(records, ensure_ascii=False))
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records[:1]))
    datasets.Dataset.from_list(records[:1]).to_parquet(str(tmp_path / "d.parquet"))
    from_list = build(records, chatml_tokenizer, tmp_path)
    assert [s["labels"] for s in build(tmp_path / "d.json", chatml_tokenizer, tmp_path)] == [
        s["labels"] for s in from_list
    ]
    for name in ("d.jsonl", "d.parquet"):
        assert build(tmp_path / name, chatml_tokenizer, tmp_path)[0] == from_list[0]
