"""TRL's standard kinds as TRL trains them: plain text with no chat template, the completion (or all) and eos learnt."""

from __future__ import annotations

import copy

import pytest
from tokenizers.processors import TemplateProcessing

from hf_lora_ds.data.audit.inference_prompts import round_trip
from hf_lora_ds.data.dataset import IGNORE_INDEX
from hf_lora_ds.data.formats import FormatOptions, to_messages
from hf_lora_ds.data.masking.template_rule import TemplateError
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import END, build, chatml, expect, sample


def pieces(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """The prompt tokenized alone (as inference tokenizes it), then the completion and eos, trained."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    rest = tokenizer(completion + END, add_special_tokens=False)["input_ids"]
    return prompt_ids + rest, [IGNORE_INDEX] * len(prompt_ids) + rest


def test_standard_prompt_completion_is_plain_text_with_the_completion_trained(chatml_tokenizer, tmp_path):
    record = {"prompt": "The quick brown fox", "completion": " jumps over the lazy dog."}
    assert sample(build([record], chatml_tokenizer, tmp_path)) == pieces(chatml_tokenizer, *record.values())


def test_a_token_across_the_prompt_end_is_cut_there_as_inference_tokenizes_the_prompt(chatml_tokenizer, tmp_path):
    """'The quick brown fo' + 'x': one token of the whole text crosses the boundary; the prompt stays whole."""
    whole = chatml_tokenizer("The quick brown fox", add_special_tokens=False, return_offsets_mapping=True)
    assert any(start < 17 < end for start, end in whole["offset_mapping"])  # the case described, as built
    record = {"prompt": "The quick brown fo", "completion": "x jumps."}
    assert sample(build([record], chatml_tokenizer, tmp_path)) == pieces(chatml_tokenizer, *record.values())


def test_language_modeling_text_is_trained_whole_with_eos(chatml_tokenizer, tmp_path):
    text = "The quick brown fox jumps over the lazy dog."
    ids = chatml_tokenizer(text + END, add_special_tokens=False)["input_ids"]
    assert sample(build([{"text": text}], chatml_tokenizer, tmp_path)) == (ids, ids)
    already_ended = build([{"text": text + END}], chatml_tokenizer, tmp_path / "b")
    assert sample(already_ended) == (ids, ids)


def test_a_tokenizer_that_adds_a_bos_gets_it_untrained_in_front(chatml_tokenizer, tmp_path):
    """As TRL tokenizes plain text with the tokenizer's special tokens (Llama's BOS)."""
    tokenizer = copy.deepcopy(chatml_tokenizer)
    tokenizer.bos_token = "<|im_start|>"
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", tokenizer.bos_token_id)]
    )
    record = {"prompt": "The quick brown fox", "completion": " jumps."}
    ids, labels = pieces(tokenizer, *record.values())
    assert sample(build([record], tokenizer, tmp_path)) == ([tokenizer.bos_token_id, *ids], [IGNORE_INDEX, *labels])


def test_columns_still_render_standard_records_as_a_chat_turn(chatml_tokenizer, tmp_path):
    options = FormatOptions.from_flags("prompt=prompt,response=completion", None)
    dataset = build([{"prompt": "1=", "completion": "0 + 1"}], chatml_tokenizer, tmp_path, formats=options)
    text = chatml(("user", "1="), ("assistant", "0 + 1"))
    assert sample(dataset) == expect(chatml_tokenizer, text, ["0 + 1" + END])


def test_plain_text_records_mix_with_chat_records_and_skip_the_round_trip(chatml_tokenizer, tmp_path):
    records = [{"text": "The quick brown fox."}, {"instruction": "1=", "output": "0 + 1"}]
    dataset = build(records, chatml_tokenizer, tmp_path)
    assert len(dataset) == 2 and round_trip(dataset).turns == 1


def test_plain_text_cannot_prompt_a_generation_eval():
    with pytest.raises(DataError, match="^r: a plain-text record .* has no chat turns"):
        to_messages({"text": "x"}, where="r")


def test_a_tokenizer_without_eos_is_refused_for_plain_text(chatml_tokenizer, tmp_path):
    tokenizer = copy.deepcopy(chatml_tokenizer)
    tokenizer.eos_token = None
    with pytest.raises(TemplateError, match="no eos_token to end a plain-text sample"):
        build([{"text": "The quick brown fox."}], tokenizer, tmp_path)
