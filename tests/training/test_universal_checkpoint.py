"""hf_lora_ds.training.universal_checkpoint: which checkpoints need a universal conversion, which runs can load one, and
the conversion's reuse and failure handling. The conversion itself, on a real 2-rank ZeRO checkpoint resumed on 1 rank,
is tests/e2e/test_universal_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from deepspeed.checkpoint import ds_to_universal

from hf_lora_ds.errors import UserError
from hf_lora_ds.training import universal_checkpoint as universal


def _zero_checkpoint(path, ranks: int, prefix: str = "") -> None:
    step = path / "global_step4"
    step.mkdir(parents=True)
    (path / "latest").write_text("global_step4\n")
    for rank in range(ranks):
        (step / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").touch()
        (step / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").touch()  # not an optimizer partition


@pytest.mark.parametrize(("ranks", "prefix"), [(1, ""), (2, ""), (3, "bf16_")])
def test_world_size_is_the_number_of_optimizer_partitions(tmp_path, ranks, prefix):
    _zero_checkpoint(tmp_path, ranks, prefix)
    assert universal.zero_checkpoint_world_size(tmp_path) == ranks


def test_a_checkpoint_without_zero_partitions_has_no_world_size(tmp_path):
    (tmp_path / "optimizer.pt").touch()  # Trainer's own checkpoint
    assert universal.zero_checkpoint_world_size(tmp_path) is None


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (None, "no --deepspeed config"),
        ({"zero_optimization": {"stage": 0}}, "ZeRO stage 0"),
        ({}, "ZeRO stage 0"),
        ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}, "NVMe optimizer offload"),
    ],
)
def test_runs_that_cannot_load_a_universal_checkpoint_say_why(config, why):
    assert why in universal.universal_refusal(config)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_runs_can_load_one_also_with_cpu_offload(stage):
    config = {"zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}}}
    assert universal.universal_refusal(config) is None


def test_a_finished_conversion_is_reused_not_redone(tmp_path, monkeypatch):
    _zero_checkpoint(tmp_path, 2)
    done = tmp_path / "global_step4_universal"
    done.mkdir()
    (done / universal.UNIVERSAL_MARKER).write_text("{}")
    monkeypatch.setattr(ds_to_universal, "main", lambda args: pytest.fail("converted again"))
    assert universal.convert_to_universal(tmp_path) == done


def test_a_conversion_marks_its_folder_complete_only_after_it_finished(tmp_path, monkeypatch):
    _zero_checkpoint(tmp_path, 2)
    seen = []

    def convert(args):
        Path(args.output_folder).mkdir()
        seen.append((args.input_folder, args.output_folder))

    monkeypatch.setattr(ds_to_universal, "main", convert)
    output = universal.convert_to_universal(tmp_path)
    assert seen == [(str(tmp_path / "global_step4"), str(output))]
    assert (output / universal.UNIVERSAL_MARKER).read_text() == '{"source": "global_step4", "ranks": 2}'


def test_a_failed_conversion_is_one_user_error_and_loading_stays_off(tmp_path, monkeypatch):
    _zero_checkpoint(tmp_path, 2)

    def broken(args):
        raise KeyError("param_shapes")

    monkeypatch.setattr(ds_to_universal, "main", broken)
    config = {"zero_optimization": {"stage": 2}}
    with pytest.raises(
        UserError, match=r"converting .* to a DeepSpeed universal checkpoint .* KeyError: 'param_shapes'"
    ):
        universal.enable_universal_loading(tmp_path, config, is_main_process=True)
    assert "checkpoint" not in config


def test_loading_is_switched_on_in_the_live_config(tmp_path, monkeypatch):
    _zero_checkpoint(tmp_path, 2)
    monkeypatch.setattr(ds_to_universal, "main", lambda args: Path(args.output_folder).mkdir())
    config = {"zero_optimization": {"stage": 2}}
    universal.enable_universal_loading(tmp_path, config, is_main_process=True)
    assert config["checkpoint"] == {"load_universal": True}
