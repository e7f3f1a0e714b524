"""The eval task registry: the built-in tasks, and a user's class, instance or function registered by name."""

from __future__ import annotations

import pytest

from hf_lora_ds.eval import Sample, Task, Verdict, available_tasks, get_task, register_task, task_registry


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Tests register tasks; keep them out of the process-wide registry."""
    monkeypatch.setattr(task_registry, "_REGISTRY", dict(task_registry._REGISTRY))


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
