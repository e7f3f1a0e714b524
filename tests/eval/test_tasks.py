"""exact_match, regex and numeric scoring; the task registry; how records become samples."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.records import DataError
from hf_lora_ds.eval import Sample, Task, Verdict, available_tasks, get_task, register_task, task_registry


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Tests register tasks; keep them out of the process-wide registry."""
    monkeypatch.setattr(task_registry, "_REGISTRY", dict(task_registry._REGISTRY))


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


def test_builtin_tasks_are_registered():
    assert {"sum_to_x", "exact_match", "regex", "numeric"} <= set(available_tasks())


def test_register_a_function_with_the_decorator():
    @register_task(max_new_tokens=4)
    def shouts(output: str, sample: Sample) -> bool:
        return output.isupper()

    task = get_task("shouts")
    assert task.name == "shouts" and task.max_new_tokens == 4
    sample = task.sample({"instruction": "q", "output": "A"})
    assert task.score("HEY", sample) == Verdict(True, "HEY", None)
    assert task.score("hey", sample) == Verdict(False, "hey", "incorrect")


def test_register_a_class_with_options():
    @register_task
    class LengthAtMost(Task):
        name = "length_at_most"

        def __init__(self, limit: int = 3) -> None:
            self.limit = limit

        def score(self, output: str, sample: Sample) -> Verdict:
            ok = len(output) <= self.limit
            return Verdict(ok, output, None if ok else "too long")

    sample = Sample(prompt=[], reference="")
    assert get_task("length_at_most").score("abcd", sample).reason == "too long"
    assert get_task("length_at_most", limit=5).score("abcd", sample).correct


def test_register_an_instance_and_name_clashes():
    register_task(get_task("exact_match", ignore_case=True), name="exact_match_ci")
    assert get_task("exact_match_ci").ignore_case
    with pytest.raises(TypeError, match="takes no options"):
        get_task("exact_match_ci", ignore_case=False)
    with pytest.raises(ValueError, match="already registered"):
        register_task(lambda output, sample: True, name="exact_match")
    register_task(lambda output, sample: True, name="exact_match", overwrite=True)
    assert get_task("exact_match").score("anything", Sample([], "x")).correct


def test_unknown_task_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown eval task 'sum-to-x'.*'sum_to_x'"):
        get_task("sum-to-x")


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
