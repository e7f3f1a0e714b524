"""``--resume_from_checkpoint auto`` takes the latest checkpoint every rank finished writing, never a torn one.

The kill-and-resume runs themselves are in tests/e2e/test_resume.py.
"""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.training.checkpoints import (
    COMPLETE_MARKER,
    RankLostError,
    find_latest_complete_checkpoint,
    lost_ranks,
    mark_checkpoint_complete,
    resolve_resume_checkpoint,
)


def _resolved(*args, **kwargs) -> tuple[str | None, str | None]:
    point = resolve_resume_checkpoint(*args, **kwargs)
    return point.checkpoint, point.note


def _checkpoint(root, step: int, complete: bool):
    path = root / f"checkpoint-{step}"
    (path / f"global_step{step}").mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "adapter_model.safetensors").write_bytes(b"x" * 100)
    (path / f"global_step{step}" / "zero_pp_rank_1_optim_states.pt").write_bytes(b"y" * 50)
    if complete:
        mark_checkpoint_complete(path, step, world_size=2)
    return path


def test_auto_skips_unmarked_truncated_and_foreign_directories(tmp_path):
    two = _checkpoint(tmp_path, 2, complete=True)
    _checkpoint(tmp_path, 4, complete=False)  # the kill landed before every rank had finished
    six = _checkpoint(tmp_path, 6, complete=True)
    (six / "global_step6" / "zero_pp_rank_1_optim_states.pt").write_bytes(b"y" * 7)  # truncated after marking
    eight = _checkpoint(tmp_path, 8, complete=True)
    (eight / COMPLETE_MARKER).write_text('{"global_step": 8, "files": {"trainer_')  # a torn marker
    _checkpoint(tmp_path, 10, complete=True).rename(tmp_path / "checkpoint-10-old")  # not Trainer's name pattern

    latest, skipped = find_latest_complete_checkpoint(tmp_path)
    assert latest == two
    assert [path.name for path in skipped] == ["checkpoint-8", "checkpoint-6", "checkpoint-4"]
    assert _resolved("auto", tmp_path) == (
        str(two),
        f"resume: from {two} (latest complete checkpoint; skipped incomplete checkpoint-8, checkpoint-6, checkpoint-4)",
    )


def test_auto_without_a_complete_checkpoint_starts_fresh_and_says_so(tmp_path):
    assert _resolved("auto", tmp_path / "never-written") == (
        None,
        f"resume: no complete checkpoint in {tmp_path / 'never-written'}, starting fresh",
    )
    _checkpoint(tmp_path, 3, complete=False)
    path, note = _resolved("auto", tmp_path)
    assert path is None and note.endswith("starting fresh; skipped incomplete checkpoint-3")


def test_explicit_paths(tmp_path):
    assert _resolved(None, tmp_path) == (None, None)
    complete, unmarked = _checkpoint(tmp_path, 2, complete=True), _checkpoint(tmp_path, 4, complete=False)
    assert _resolved(str(complete), tmp_path) == (str(complete), f"resume: from {complete}")
    path, note = _resolved(str(unmarked), tmp_path)  # the user's explicit choice, with a warning
    assert path == str(unmarked) and f"has no {COMPLETE_MARKER}" in note and "'auto'" in note
    with pytest.raises(FileNotFoundError, match="not a Trainer checkpoint.*'auto'"):
        resolve_resume_checkpoint("True", tmp_path)


def test_zero_checkpoints_on_another_number_of_ranks_need_a_run_that_loads_universal_checkpoints(tmp_path):
    checkpoint = _checkpoint(tmp_path, 2, complete=True)  # holds zero_pp_rank_1 only: not a ZeRO shard name
    for rank in (0, 1):
        (checkpoint / "global_step2" / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"z")
    mark_checkpoint_complete(checkpoint, 2, world_size=2)
    assert not resolve_resume_checkpoint("auto", tmp_path, world_size=2).repartitioned
    assert _resolved("auto", tmp_path, world_size=2) == (
        str(checkpoint),
        f"resume: from {checkpoint} (latest complete checkpoint)",
    )
    zero2 = {"zero_optimization": {"stage": 2}}
    for value in ("auto", str(checkpoint)):
        path, note = _resolved(value, tmp_path, world_size=1, deepspeed_config=zero2)
        assert path == str(checkpoint) and resolve_resume_checkpoint(value, tmp_path, 1, zero2).repartitioned
        assert note.endswith(
            "; written by 2 ranks, this run has 1: it is converted to a DeepSpeed universal "
            "checkpoint and re-partitioned"
        )
    refusals = {
        "no --deepspeed config": None,
        "ZeRO stage 0": {"zero_optimization": {"stage": 0}},
        "NVMe optimizer offload": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
    }
    for reason, config in refusals.items():
        for value in ("auto", str(checkpoint)):
            with pytest.raises(
                ValueError, match=f"partitioned over 2 ranks, and this run has 1;.*{reason}.*Resume with 2 ranks"
            ):
                resolve_resume_checkpoint(value, tmp_path, world_size=1, deepspeed_config=config)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "trainer_state.json").write_text("{}")  # Trainer's own format: any world size
    assert _resolved(str(tmp_path / "plain"), tmp_path, world_size=4)[0] == str(tmp_path / "plain")


def test_a_rank_gone_from_a_collective_is_one_line_naming_the_last_complete_checkpoint(tmp_path):
    """A rank SIGKILLed inside a save leaves the survivors' next collective with gloo's "Connection reset by peer"."""
    _checkpoint(tmp_path, 2, complete=True)
    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by peer.")
    with pytest.raises(
        RankLostError,
        match=rf"^another rank of this run stopped \(its connection: Connection reset by "
        rf"peer; .*\); {tmp_path}/checkpoint-2 is the last complete checkpoint",
    ):
        with lost_ranks(tmp_path):
            raise gloo
    with pytest.raises(RuntimeError, match="a bug"), lost_ranks(tmp_path):
        raise RuntimeError("a bug, not a lost rank")
