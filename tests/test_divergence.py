"""The divergence guard: a finite run going wrong (loss far above its median, gradient norm stuck at exactly 0)."""

from __future__ import annotations

import json

import pytest

import run_sft
from hf_lora_ds.divergence import DivergenceCallback
from hf_lora_ds.errors import run_cli


def signs(losses, grad_norms):
    guard = DivergenceCallback()
    return [guard.sign(loss, grad) for loss, grad in zip(losses, grad_norms)]


def test_signs():
    noisy = [4.0, 3.1, 4.6, 2.9, 3.3, 2.5, 2.8, 1.9, 2.2, 1.4]  # a normal run: noisy, falling
    assert signs(noisy, [0.5] * 10) == [None] * 10
    spike = signs([4.0, 4.1, 3.9, 4.0, 4.2, 12.4], [0.5] * 6)
    assert spike[:5] == [None] * 5 and spike[5][0] == "loss" and "12.4 is over 3x its running median 4" in spike[5][1]
    assert signs([4.0] * 4, [0.0, 0.2, 0.0, 0.0])[2][0] == "grad_norm"
    assert signs([4.0] * 2, [0.0, 0.0]) == [None, None]  # zero from the start: nothing to compare with


DIVERGING = ["--eval_file", "", "--max_steps", "6", "--logging_steps", "1", "--learning_rate", "1e6",
             "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--per_device_train_batch_size", "8"]  # fmt: skip


def test_diverging_run_warns_and_records_the_step(tmp_path, capsys):
    """The demo at --learning_rate 1e6: the loss stays finite, the gradient norm is 0 from step 2 on."""
    run_sft.main([*DIVERGING, "--output_dir", str(tmp_path)])
    warnings = [line for line in capsys.readouterr().out.splitlines() if "divergence at step" in line]
    assert warnings == [f"warning: divergence at step 2: gradient norm is exactly 0 after non-zero steps (the adapter "
                        "stopped learning); lower --learning_rate (or raise --warmup_steps) (--on_divergence stop "
                        "ends the run here)"]  # fmt: skip
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [entry["divergence_step"] for entry in history if "divergence_step" in entry] == [2]


def test_on_divergence_stop(tmp_path, capsys):
    with pytest.raises(SystemExit) as leaving:
        run_cli(lambda: run_sft.main([*DIVERGING, "--output_dir", str(tmp_path), "--on_divergence", "stop"]))
    assert leaving.value.code == 2
    # after the progress bar's last update, on the same terminal line
    error = [line[line.index("error: "):] for line in capsys.readouterr().err.splitlines() if "error: " in line]
    assert error == ["error: divergence at step 2: gradient norm is exactly 0 after non-zero steps (the adapter "
                     "stopped learning); lower --learning_rate (or raise --warmup_steps); stopped by --on_divergence "
                     "stop, no complete checkpoint yet"]  # fmt: skip
