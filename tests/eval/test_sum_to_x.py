"""The sum-to-x scorer on tricky completions, and how it reads x and the prefix from a record."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.records import DataError
from hf_lora_ds.eval import DEFAULT_PREFIX, SumToXTask, get_task

P = DEFAULT_PREFIX
RECORD = {"instruction": "5=", "input": "", "output": f"{P}1 + 4"}

# (completion, correct, parsed answer, reason) for the prompt "5=".
TABLE = [
    (f"{P}1 + 4", True, "1 + 4", None),
    (f"{P}2 + 3", True, "2 + 3", None),  # another valid split than the reference's
    (f"{P}1+4", True, "1 + 4", None),  # no spaces around +
    (f"  {P} 1  +\t4 \n", True, "1 + 4", None),  # whitespace at the ends, after the prefix, around +
    (f"{P}0 + 5", True, "0 + 5", None),  # zero counts
    (f"{P}-3 + 8", True, "-3 + 8", None),  # negative integers count
    (f"{P}9 + -4", True, "9 + -4", None),
    (f"{P}05 + 0", True, "5 + 0", None),  # leading zeros are still integers
    ("", False, None, "empty output"),
    (" \n ", False, None, "empty output"),
    ("1 + 4", False, None, "no prefix"),
    (f"{P[:-1]}1 + 4", False, None, "no prefix"),  # altered prefix: one '>' short
    ("王大丫丫的回答是：1 + 4", False, None, "no prefix"),
    (f"答案{P}1 + 4", False, None, "no prefix"),  # text before the prefix
    (P, False, None, "not integers"),
    (f"{P}5", False, "5", "not integers"),
    (f"{P}1.5 + 3.5", False, "1.5 + 3.5", "not integers"),
    (f"{P}1 + 4.0", False, "1 + 4.0", "not integers"),
    (f"{P}one + four", False, "one + four", "not integers"),
    (f"{P}+1 + 4", False, "+1 + 4", "not integers"),
    (f"{P}１ + ４", False, "１ + ４", "not integers"),  # full-width digits
    (f"{P}1 + 4。", False, "1 + 4", "extra text"),
    (f"{P}1 + 4 + 0", False, "1 + 4", "extra text"),
    (f"{P}1 + 4\n{P}2 + 3", False, "1 + 4", "extra text"),
    (f"{P}1 + 4<|im_start|>", False, "1 + 4", "extra text"),
    (f"{P}1 + 3", False, "1 + 3", "wrong sum"),
    (f"{P}-1 + 4", False, "-1 + 4", "wrong sum"),
    (f"{P}10 + 40", False, "10 + 40", "wrong sum"),
]


@pytest.mark.parametrize(("completion", "correct", "answer", "reason"), TABLE)
def test_scorer_table(completion, correct, answer, reason):
    task = get_task("sum_to_x")
    verdict = task.score(completion, task.sample(RECORD))
    assert (verdict.correct, verdict.answer, verdict.reason) == (correct, answer, reason)


def test_prefix_comes_from_the_reference():
    task = SumToXTask()
    sample = task.sample({"instruction": "7=", "output": "Answer: 3 + 4"})
    assert task.score("Answer: 5 + 2", sample).correct
    assert task.score(f"{P}5 + 2", sample).reason == "no prefix"


def test_task_prefix_when_the_reference_has_no_sum():
    default = SumToXTask()
    assert default.score(f"{P}5 + 2", default.sample({"instruction": "7=", "output": "seven"})).correct
    custom = SumToXTask(prefix="=> ")
    sample = custom.sample({"instruction": "7=", "output": "seven"})
    assert custom.score("=> 5 + 2", sample).correct
    assert custom.score(f"{P}5 + 2", sample).reason == "no prefix"


def test_x_is_the_last_x_equals_in_the_last_user_turn():
    task = SumToXTask()
    alpaca = task.sample({"instruction": "Add up to the number.", "input": "3= no, 12 =", "output": f"{P}5 + 7"})
    assert alpaca.target.x == 12
    chat = task.sample(
        {
            "messages": [
                {"role": "system", "content": "calculator"},
                {"role": "user", "content": "4="},
                {"role": "assistant", "content": f"{P}1 + 3"},
                {"role": "user", "content": "-6="},
                {"role": "assistant", "content": f"{P}-7 + 1"},
            ]
        }
    )
    assert chat.target.x == -6
    assert chat.reference == f"{P}-7 + 1"
    assert [m["role"] for m in chat.prompt] == ["system", "user", "assistant", "user"]
    assert task.score(f"{P}-10 + 4", chat).correct


def test_record_without_x_names_where_and_field():
    with pytest.raises(DataError, match=r"eval.json, line 3: field 'instruction'.*'\{x\}='"):
        SumToXTask().sample({"instruction": "how much?", "output": f"{P}1 + 4"}, where="eval.json, line 3")
