"""The launch helpers' own guarantees: a launch that runs past its deadline is killed with every process it
started, as a hung rank would otherwise keep running beside the next tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.e2e.launching import run

pytestmark = pytest.mark.slow

GRANDCHILD = "import subprocess, sys, time; open(sys.argv[1], 'w').write(str(subprocess.Popen([sys.executable, '-c', \
'import time; time.sleep(60)']).pid)); time.sleep(60)"


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
