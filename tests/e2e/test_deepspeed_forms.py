"""``--deepspeed`` as base64 text trains exactly as the file it encodes: the same adapter after the same steps."""

from __future__ import annotations

import base64

import pytest
import torch

from hf_lora_ds.resources import DEEPSPEED_CONFIGS
from tests.e2e.launching import RUN_SFT, adapter_weights, check_ok, launcher, run, sft_args

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1200)  # two launches of LAUNCH_TIMEOUT_S (600 s) at most each
def test_a_base64_config_trains_as_its_file(tiny_model_dir, sum_data, tmp_path):
    config = DEEPSPEED_CONFIGS / "stage2.json"
    forms = {"file": str(config), "base64": base64.urlsafe_b64encode(config.read_bytes()).decode()}
    for name, value in forms.items():
        out = tmp_path / name
        args = sft_args(tiny_model_dir, sum_data, out, "--deepspeed", value, eval_file=False)
        launch = run(launcher("python") + [str(RUN_SFT), *args], tmp_path / f"{name}.log")
        check_ok(launch)
        assert "engine: DeepSpeed ZeRO-2" in launch.log
    by_file, by_text = adapter_weights(tmp_path / "file"), adapter_weights(tmp_path / "base64")
    assert by_file.keys() == by_text.keys()
    for key, tensor in by_file.items():
        torch.testing.assert_close(by_text[key], tensor, rtol=0, atol=0)
