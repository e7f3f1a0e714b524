"""The ``engine:`` line is read from what trains (hf_lora_ds.callbacks.engine_line), and a run that did not get the
engine it asked for stops before its first step. The DeepSpeed and FSDP2 lines are checked on 2-rank launches
(tests/e2e/test_accelerate.py, test_resume.py); here the single-process line and the mismatch stop."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_lora_ds.callbacks.engine_line import EngineMismatchError, check_engine_honoured, engine_line, engine_record
from hf_lora_ds.config.engine import Engine
from tests.trainer.test_lora_sft_trainer import make_trainer


def test_single_process_run_prints_and_records_its_engine(tiny_model, qwen_style_tokenizer, tmp_path, package_log):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    trainer.train()
    line = "engine: plain, world size 1, backend none, weights float32, mixed precision no"
    assert package_log.read().count(line) == 1
    trainer.save_state()
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert [entry["engine"] for entry in state["log_history"] if "engine" in entry] == [line.removeprefix("engine: ")]


def record(**overrides) -> dict:
    return {
        "engine": "DDP",
        "world_size": 2,
        "backend": "gloo",
        "weights_dtype": "float32",
        "mixed_precision": "no",
        **overrides,
    }


DEEPSPEED = Engine("deepspeed", {}, Path("x.json"))


@pytest.mark.parametrize(
    ("engine", "asked"),
    [
        (Engine("fsdp"), "--fsdp / an Accelerate FSDP config asked for FSDP2"),
        (DEEPSPEED, "--deepspeed x.json asked for DeepSpeed"),
    ],
)
def test_an_engine_not_honoured_stops_the_run(engine, asked):
    trainer = SimpleNamespace(args=SimpleNamespace(engine=engine))
    with pytest.raises(
        EngineMismatchError,
        match=f"{asked}, but the run would train with engine: DDP, world size 2, backend gloo",
    ):
        check_engine_honoured(trainer, record())


def test_honoured_engines_pass_and_name_their_setup():
    trainer = SimpleNamespace(args=SimpleNamespace(engine=DEEPSPEED))
    zero3 = record(engine="DeepSpeed", zero_stage=3, offload_optimizer="cpu", offload_parameters="none")
    check_engine_honoured(trainer, zero3)
    assert engine_line(zero3).startswith("engine: DeepSpeed ZeRO-3 (offload optimizer cpu), world size 2")
    fsdp = record(engine="FSDP2", sharded_modules=7, reshard_after_forward=True, offload_parameters="cpu")
    check_engine_honoured(SimpleNamespace(args=SimpleNamespace(engine=Engine("fsdp"))), fsdp)
    assert engine_line(fsdp).startswith("engine: FSDP2 (full shard of 7 modules, offload parameters cpu)")


class DeepSpeedEngine(torch.nn.Module):
    """The parts of deepspeed's engine the line reads: ZeRO-3 offloading the optimizer only (DeepSpeed's own
    ``zero_offload_optimizer`` / ``zero_offload_param`` give the offload config, or None where there is none)."""

    def zero_optimization_stage(self):
        return 3

    def zero_offload_optimizer(self):
        return SimpleNamespace(device="cpu")

    def zero_offload_param(self):
        return None

    def bfloat16_enabled(self):
        return False

    def fp16_enabled(self):
        return False


def test_the_deepspeed_line_reads_optimizer_and_parameter_offload_each_from_its_own_config():
    trainer = SimpleNamespace(
        model_wrapped=DeepSpeedEngine(), model=torch.nn.Linear(2, 2), accelerator=SimpleNamespace(num_processes=1)
    )
    line = engine_line(engine_record(trainer))
    assert line == (
        "engine: DeepSpeed ZeRO-3 (offload optimizer cpu), world size 1, backend none, weights float32, "
        "mixed precision no"
    )


def test_sequence_parallelism_is_on_the_line_and_must_be_what_was_asked():
    """The 2-rank line is checked on the launches of tests/e2e/test_sequence_parallel.py."""
    asked = SimpleNamespace(args=SimpleNamespace(engine=Engine("deepspeed", {}, Path("x.json"), sequence_parallel=2)))
    split = record(
        engine="DeepSpeed",
        zero_stage=2,
        offload_optimizer="none",
        offload_parameters="none",
        sequence_parallel=2,
        world_size=4,
    )
    check_engine_honoured(asked, split)
    assert engine_line(split).startswith(
        "engine: DeepSpeed ZeRO-2, sequence parallel 2 (Ulysses; 2 data-parallel groups), world size 4"
    )
    with pytest.raises(
        EngineMismatchError,
        match="--sequence_parallel_size 2, but the run would train with engine: DeepSpeed ZeRO-2, world size 4",
    ):
        check_engine_honoured(asked, {**split, "sequence_parallel": 1})
