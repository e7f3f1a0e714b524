"""The launch helpers' own guarantees: a launch that runs past its deadline is killed with every process it
started, as a hung rank would otherwise keep running beside the next tests; a launch shared by several tests runs
once, also when it fails; every process the suite starts runs this environment's ``ninja``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.launching import launch_env, once_per_key, run

GRANDCHILD = "import subprocess, sys, time; open(sys.argv[1], 'w').write(str(subprocess.Popen([sys.executable, '-c', \
'import time; time.sleep(60)']).pid)); time.sleep(60)"


@pytest.mark.slow
def test_a_timed_out_launch_leaves_no_rank_behind(tmp_path):
    pid_file = tmp_path / "rank.pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run([sys.executable, "-c", GRANDCHILD, str(pid_file)], tmp_path / "launch.log", timeout=5)
    rank = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank), f"the launcher's child {rank} outlived the timed-out launch"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a killed child not yet reaped by its parent is a zombie: gone
        return stat.read().split()[2] != "Z"


@pytest.mark.parametrize(
    "failure",
    [
        AssertionError("rank 1 exited 1"),
        subprocess.TimeoutExpired(["deepspeed"], 600),
        pytest.fail.Exception("Timeout (>600.0s) from pytest-timeout."),
    ],
    ids=["assertion", "launch timeout", "test timeout"],
)
def test_a_shared_launch_that_fails_is_not_launched_again_for_the_next_test(failure):
    launched = []

    def launch(*key):
        launched.append(key)
        raise failure

    shared = once_per_key(launch)
    for _ in range(3):  # three tests share the launch
        with pytest.raises(type(failure)):
            shared("deepspeed", 2)
    assert launched == [("deepspeed", 2)]
    shared_ok = once_per_key(lambda *key: key)
    assert shared_ok("torchrun", 2) == ("torchrun", 2) and shared_ok("torchrun", 2) is shared_ok("torchrun", 2)


def test_every_process_finds_this_environments_ninja_first():
    """DeepSpeed's op builds run the first ``ninja`` on PATH; a venv's and the system's disagree on what is built
    (tests/conftest.py), so what this process and its children (a wheel's venv adds only its own bin) find first is
    this environment's: the binary of the ``ninja`` package, which setup.cfg requires (in a venv, beside the
    interpreter). The suite's own PATH must hold that, not the shell's activation: the entry ``activate`` put on
    PATH is taken out first."""
    import ninja

    own = Path(ninja.BIN_DIR, "ninja")
    assert own.is_file(), f"the ninja package ({ninja.__file__}) has no binary where it says: {own}"
    for path in (os.environ["PATH"], launch_env()["PATH"]):
        unactivated = _without_activation(path)
        found = shutil.which("ninja", path=unactivated)
        assert found and os.path.samefile(found, own), (found, str(own), unactivated)


def _without_activation(path: str) -> str:
    """``path`` as an unactivated shell would have handed it on: one occurrence of ``$VIRTUAL_ENV/bin`` (the entry a
    venv's ``activate`` prepends) removed, where a venv is active."""
    entries = path.split(os.pathsep)
    activated = os.path.join(os.environ["VIRTUAL_ENV"], "bin") if os.environ.get("VIRTUAL_ENV") else None
    if activated in entries:
        entries.remove(activated)
    return os.pathsep.join(entries)
