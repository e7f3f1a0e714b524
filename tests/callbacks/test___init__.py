"""The package's SwanLab names are imported on first use, so that a run which does not report to SwanLab never pays for
importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_swanlab_is_imported_only_by_a_run_that_reports_to_it():
    """Importing swanlab cost every process ~2 s here; run_sft.py's imports (its --help path) and the package's
    callbacks leave it out, and the package still hands out its SwanLab names."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['run_sft.py', '--help']\n"
        "try:\n    runpy.run_path('run_sft.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "imported = 'swanlab' in sys.modules\n"
        "from hf_lora_ds.callbacks import SwanLabCallback, use_swanlab\n"
        "print(imported, SwanLabCallback.__module__, 'swanlab' in sys.modules)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "False hf_lora_ds.callbacks.swanlab True"
