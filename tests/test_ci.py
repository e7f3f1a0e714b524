""".ci/run runs the README's test command, the one a user copies, on a home without caches; the only other thing it
installs is system packages (whose tests skip without them). Two paths, CI's and the user's, let a test pass in CI
that fails on a fresh machine."""

from __future__ import annotations

import re

from tests import REPO
from tests.test_readme_zh import fenced, first_screen

CI = (REPO / ".ci" / "run").read_text(encoding="utf-8")


def readme_test_command() -> str:
    """The README's second first-screen command: the one that sets up and passes the tests."""
    setup, tests = fenced(first_screen((REPO / "README.md").read_text(encoding="utf-8")), "bash")
    (command,) = tests.strip().splitlines()
    return command


def _code(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_ci_runs_the_readmes_test_command_and_installs_nothing_else_with_pip():
    command = readme_test_command()
    lines = _code(CI)
    running = [line for line in lines if line.startswith(command)]
    assert running == [f"{command} || status=$?"], running
    others = [
        line for line in lines if re.search(r"\bpip3? (install|download)\b|-m pip\b", line) and line not in running
    ]
    assert others == [], others  # what the suite needs comes from the command itself


def test_ci_runs_it_in_an_empty_home_with_no_cache_variable_left():
    lines = _code(CI)
    command = lines.index(f"{readme_test_command()} || status=$?")
    assert "fresh_home=$(mktemp -d)" in lines[:command] and 'export HOME="$fresh_home"' in lines[:command]
    unset = next(line for line in lines[:command] if line.startswith("unset "))
    for variable in ("XDG_CACHE_HOME", "PIP_CACHE_DIR", "HF_HOME", "HF_DATASETS_CACHE", "HF_LORA_DS_TEST_CACHE"):
        assert variable in unset.split(), variable
