"""A pytest plugin for run_acceptance.py's ``gpu_tests`` stage (``-p bench.gpu.pytest_budget --stop_at T``): the
session ends by ``T`` (``time.time()``) so that its junit XML is always written, and the in-process tests run first.

- Order: the ``slow`` tests (tests/plan/test_gpu.py's, each a run_sft and a planner process) after the others.
  tests/conftest.py puts them first, for pytest-xdist's workers; in this one process the quick ones would then wait
  behind minutes of launches and a short budget would run none of them.
- Budget: each test's timeout (pytest-timeout's ``--timeout``) is cut to what is left before ``T`` less a margin for
  the teardown and the report; a test that would get under ``SHORTEST_S`` is skipped, saying so, and so is every one
  after it. A test stuck where a signal does not reach (inside a CUDA call) is left to the stage's own timeout.
"""

from __future__ import annotations

import time

import pytest

MARGIN_S = 10.0  # teardown, the junit XML and the interpreter's exit
SHORTEST_S = 5.0
BUDGET_SPENT = "the gpu_tests stage's budget was spent"


def pytest_addoption(parser) -> None:
    parser.addoption("--stop_at", type=float, default=None, help="time.time() by which the session ends")


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's order
def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)  # stable: files keep their order


@pytest.hookimpl(tryfirst=True, hookwrapper=True)  # before pytest-timeout reads the test's timeout
def pytest_runtest_protocol(item, nextitem):
    stop_at = item.config.getoption("stop_at")
    if stop_at is not None:
        left = stop_at - time.time() - MARGIN_S
        if left < SHORTEST_S:
            item.add_marker(pytest.mark.skip(reason=BUDGET_SPENT))
        else:
            marker = item.get_closest_marker("timeout")  # a test's own, else pytest-timeout's --timeout
            configured = (
                (marker.args[0] if marker.args else marker.kwargs.get("timeout"))
                if marker
                else item.config.getoption("timeout", None)
            )
            timeout = min(float(configured), left) if configured else left
            item.add_marker(pytest.mark.timeout(round(timeout, 1)), append=False)
    yield
