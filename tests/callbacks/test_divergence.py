"""The divergence guard: a finite run going wrong (loss far above its median, gradient norm stuck at exactly 0)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

import run_sft
from hf_lora_ds.callbacks.divergence import DivergenceCallback, DivergenceError
from hf_lora_ds.errors import run_cli
from hf_lora_ds.training.checkpoints import mark_checkpoint_complete


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
    assert signs([4.0, float("nan"), 4.1, 13.0], [0.5] * 4)[3][0] == "loss"  # a skipped NaN step is no history


@pytest.mark.parametrize(("is_world_process_zero", "warned"), [(True, 1), (False, 0)])
def test_the_warning_is_rank_0s(package_log, tmp_path, is_world_process_zero, warned):
    """Every rank sees the same logged loss; the warning is said once, on rank 0 (a replica's warnings show)."""
    guard = DivergenceCallback()
    state = SimpleNamespace(log_history=[], global_step=2, is_world_process_zero=is_world_process_zero)
    for loss in (4.0, 13.0):
        guard.on_log(SimpleNamespace(output_dir=str(tmp_path)), state, None, logs={"loss": loss, "grad_norm": 0.5})
    assert package_log.read().count("warning: divergence at step 2: training loss 13 is over 3x") == warned


DIVERGING = [
    "--eval_file",
    "",
    "--logging_steps",
    "1",
    "--warmup_steps",
    "0",
    "--lr_scheduler_type",
    "constant",
    "--per_device_train_batch_size",
    "8",
]
GRADIENT_STOPS = "gradient norm is exactly 0 after non-zero steps (the adapter stopped learning)"


@pytest.mark.parametrize(
    "learning_rate,sign",
    [
        ("1e6", re.escape(GRADIENT_STOPS)),  # the loss stays finite (4.3 -> 5.7), the gradient norm 0 from step 2 on
        ("3", r"training loss 1\d\.\d+ is over 3x its running median 4\.\d+"),  # 4.3 -> 14, then back to ~7
    ],
)
def test_diverging_run_warns_and_records_the_step(tmp_path, capsys, learning_rate, sign):
    """The demo at a learning rate that diverges without a NaN."""
    run_sft.main([*DIVERGING, "--max_steps", "4", "--learning_rate", learning_rate, "--output_dir", str(tmp_path)])
    warnings = [line for line in capsys.readouterr().out.splitlines() if "divergence at step" in line]
    assert len(warnings) == 1
    assert re.fullmatch(
        rf"warning: divergence at step 2: {sign}; lower --learning_rate \(or raise --warmup_steps\) "
        r"\(--on_divergence stop ends the run here\)",
        warnings[0],
    ), warnings[0]
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [entry["divergence_step"] for entry in history if "divergence_step" in entry] == [2]


def test_on_divergence_stop(tmp_path, capsys):
    with pytest.raises(SystemExit) as leaving:
        run_cli(
            lambda: run_sft.main(
                [
                    *DIVERGING,
                    "--max_steps",
                    "4",
                    "--learning_rate",
                    "1e6",
                    "--output_dir",
                    str(tmp_path),
                    "--on_divergence",
                    "stop",
                ]
            )
        )
    assert leaving.value.code == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]  # not after the bar
    assert error == [
        f"error: divergence at step 2: {GRADIENT_STOPS}; lower --learning_rate (or raise --warmup_steps); "
        "stopped by --on_divergence stop, no complete checkpoint yet"
    ]


def test_the_stop_names_the_last_complete_checkpoint(tmp_path):
    """What the user resumes from: checkpoint-2 is complete, checkpoint-4 was never marked (a save cut short)."""
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    mark_checkpoint_complete(tmp_path / "checkpoint-2", 2, world_size=1)
    guard = DivergenceCallback("stop")
    state = SimpleNamespace(global_step=5, log_history=[{"loss": 4.0}])
    guard.on_log(SimpleNamespace(output_dir=str(tmp_path)), state, None, logs={"loss": 4.0, "grad_norm": 0.5})
    with pytest.raises(
        DivergenceError,
        match=rf"stopped by --on_divergence stop, last complete checkpoint: "
        rf"{tmp_path}/checkpoint-2$",
    ):
        guard.on_log(SimpleNamespace(output_dir=str(tmp_path)), state, None, logs={"loss": 40.0, "grad_norm": 0.5})
