"""tests/conftest.py's order of the collected tests: the files that start processes first, each file's tests together
and in their own order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import _files_that_start_processes_first


@dataclass
class Item:
    """What the ordering reads of a collected test: its file and its slow mark."""

    path: Path
    name: str
    slow: bool = False

    def get_closest_marker(self, name: str):
        return pytest.mark.slow.mark if name == "slow" and self.slow else None


def test_files_with_a_test_that_starts_a_process_go_first_whole_and_in_order():
    items = [
        Item(Path("tests/a.py"), "a1"),
        Item(Path("tests/a.py"), "a2"),
        Item(Path("tests/b.py"), "b1", slow=True),
        Item(Path("tests/c.py"), "c1"),
        Item(Path("tests/c.py"), "c2", slow=True),
        Item(Path("tests/d.py"), "d1"),
    ]
    _files_that_start_processes_first(items)
    assert [item.name for item in items] == ["b1", "c1", "c2", "a1", "a2", "d1"]
