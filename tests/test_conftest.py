"""tests/conftest.py's order of the collected tests (the files that start processes first, tests/e2e's last of those,
each file's tests together and in their own order), when it starts DeepSpeed's op build (where launches run), and
what each worker freezes out of the cyclic collector's reach."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import REPO
from tests.conftest import _files_that_start_processes_first, _launches_selected

TESTS = REPO / "tests"


@dataclass
class Item:
    """What the ordering reads of a collected test: its file and its slow mark."""

    path: Path
    name: str
    slow: bool = False

    def get_closest_marker(self, name: str):
        return pytest.mark.slow.mark if name == "slow" and self.slow else None


def test_files_with_a_test_that_starts_a_process_go_first_whole_and_in_order_the_launches_last_of_them():
    items = [
        Item(TESTS / "a.py", "a1"),
        Item(TESTS / "e2e" / "test_x.py", "x1", slow=True),
        Item(TESTS / "a.py", "a2"),
        Item(TESTS / "b.py", "b1", slow=True),
        Item(TESTS / "c.py", "c1"),
        Item(TESTS / "c.py", "c2", slow=True),
        Item(TESTS / "d.py", "d1"),
    ]
    _files_that_start_processes_first(items)
    assert [item.name for item in items] == ["b1", "c1", "c2", "x1", "a1", "a2", "d1"]


@dataclass
class Options:
    markexpr: str


@dataclass
class Invocation:
    dir: Path


@dataclass
class Config:
    """What ``_launches_selected`` reads of pytest's config."""

    args: list[str]
    markexpr: str = ""

    @property
    def option(self):
        return Options(self.markexpr)

    @property
    def invocation_params(self):
        return Invocation(REPO)


@pytest.mark.parametrize(
    ("args", "markexpr", "launches"),
    [
        (["tests"], "", True),  # the README's command: testpaths
        (["tests/e2e/test_resume.py::test_x"], "", True),
        (["tests/e2e"], "slow", True),
        (["tests"], "not slow", False),  # the quick tier
        (["tests/data", "tests/cli/test_audit.py"], "", False),
    ],
)
def test_the_op_build_starts_where_launches_are_selected(args, markexpr, launches):
    assert _launches_selected(Config(args, markexpr)) == launches


def test_what_collection_imported_is_frozen_out_of_the_collectors_reach():
    """A worker's heap holds millions of objects from torch, transformers and the test modules; frozen after
    collection (``pytest_collection_finish``), the collector walks only what the tests make."""
    assert gc.isenabled()
    assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
