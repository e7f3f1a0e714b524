"""What a person sees: ``swanlab watch`` serves a local run, and a headless Chromium renders the dashboard with the
project, the run and a metric by the names hf_lora_ds gave them.

The dashboard is a JavaScript app (its HTML holds no run data), so only a browser that runs it sees those names.
Skipped where no Chromium is installed (``apt-get install chromium``; .ci/run installs it where it can).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import swanlab

from hf_lora_ds.callbacks import use_swanlab
from tests.callbacks.callback_helpers import lora_model

BROWSER = next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BROWSER is None, reason="no Chromium on PATH (apt-get install chromium) to render the dashboard"
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _watching(log_dir: Path) -> Iterator[str]:
    """``swanlab watch log_dir`` on a free loopback port, stopped on exit; yields the dashboard's URL once served."""
    port = _free_port()
    command = [sys.executable, "-m", "swanlab", "watch", str(log_dir), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_until_served(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)  # catches a server that ignores SIGTERM (a hang): it exits within a second


def _wait_until_served(url: str, server: subprocess.Popen, timeout_s: float = 240.0) -> None:
    """Polls until ``url`` answers 200; ``timeout_s`` catches a server that never serves (a hang), not a slow start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"swanlab watch exited with {server.returncode}: {server.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"swanlab watch did not serve {url} within {timeout_s} s")


def _rendered_dom(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran (virtual time lets the app fetch the run and draw it)."""
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
    command += ["--virtual-time-budget=20000", "--dump-dom", url]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout  # a hang: pytest-timeout


def test_dashboard_shows_project_run_and_metric(no_swanlab_key, make_trainer, qwen_style_tokenizer, tmp_path):
    model = lora_model(qwen_style_tokenizer)
    model.config.name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
    trainer = make_trainer(model=model, report_to="swanlab", output_dir=str(tmp_path / "sum-r8"))
    log_dir = tmp_path / "swanlog"
    use_swanlab(trainer, log_dir=str(log_dir))
    try:
        trainer.train()  # 4 steps, logged every 2
    finally:
        swanlab.finish()

    with _watching(log_dir) as url:
        dom = _rendered_dom(url, tmp_path / "chromium-profile")

    # as element text and titles, so the names come from the app's rendering, not from a config value it lists
    assert "<title>SwanLab</title>" in dom
    assert ">Qwen2.5-0.5B-Instruct-lora-sft<" in dom, "project name not on the dashboard"
    assert 'title="sum-r8"' in dom, "run name not on the dashboard"
    assert ">train/loss<" in dom, "metric not on the dashboard"
