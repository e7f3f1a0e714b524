"""exact_match, regex and numeric scoring; how records become samples."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.records import DataError
from hf_lora_ds.eval import Task, get_task


def verdict(task: Task, reference: str, output: str) -> tuple[bool, str | None, str | None]:
    result = task.score(output, task.sample({"instruction": "q", "output": reference}))
    return result.correct, result.answer, result.reason


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Paris", (True, "Paris", None)),
        ("  Paris\n", (True, "Paris", None)),
        ("paris", (False, "paris", "mismatch")),
        ("Paris.", (False, "Paris.", "mismatch")),
        ("", (False, None, "empty output")),
    ],
)
def test_exact_match(output, expected):
    assert verdict(get_task("exact_match"), "Paris", output) == expected


def test_exact_match_ignore_case():
    assert verdict(get_task("exact_match", ignore_case=True), "Paris", "PARIS")[0]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("so the answer: 42", (True, "42", None)),
        ("answer: 41", (False, "41", "wrong answer")),
        ("I think 42", (False, None, "no match")),
        ("", (False, None, "empty output")),
    ],
)
def test_regex_first_group(output, expected):
    assert verdict(get_task("regex", pattern=r"answer:\s*(\d+)"), "answer: 42", output) == expected


def test_regex_whole_match_and_case():
    assert verdict(get_task("regex", pattern=r"yes|no", ignore_case=True), "No.", "well... NO")[:2] == (True, "NO")


def test_regex_needs_a_pattern_and_a_matching_reference():
    with pytest.raises(ValueError, match="needs a pattern"):
        get_task("regex")
    task = get_task("regex", pattern=r"answer: (\d+)")
    with pytest.raises(DataError, match=r"f.jsonl, line 2: field 'output'.*does not match"):
        task.sample({"instruction": "q", "output": "42"}, where="f.jsonl, line 2")


@pytest.mark.parametrize(
    ("reference", "output", "expected"),
    [
        ("#### 42", "so it is 42", (True, "42", None)),
        ("The total is 1,234.", "1234", (True, "1234", None)),
        ("-0.5", "x = 3, y = -0.50", (True, "-0.5", None)),
        ("3", "3 apples and 4 pears", (False, "4", "wrong number")),  # the last number is the answer
        ("3", "three", (False, None, "no number")),
        ("3", "", (False, None, "empty output")),
    ],
)
def test_numeric(reference, output, expected):
    assert verdict(get_task("numeric"), reference, output) == expected


def test_numeric_reference_needs_a_number():
    with pytest.raises(DataError, match="record 4: field 'output'.*no number"):
        get_task("numeric").sample({"instruction": "q", "output": "none"}, where="record 4")


def test_sample_splits_off_the_final_assistant_turn_and_adds_the_system_prompt():
    sample = get_task("exact_match").sample(
        {"instruction": "Capital of France?", "input": "One word.", "output": "Paris"}, system_prompt="Be brief."
    )
    assert sample.prompt == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?\nOne word."},
    ]
    assert sample.reference == sample.target == "Paris"


def test_sample_needs_the_conversation_to_end_with_the_assistant():
    record = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    }
    with pytest.raises(DataError, match="record 7: field 'messages': the last turn is 'user'"):
        get_task("exact_match").sample(record, where="record 7")
