"""A tiny Qwen2.5-VL trained by run_sft.py on 2 CPU ranks under DDP, ZeRO-3, ZeRO-2 and FSDP2, where one rank's batch
has an image and the other's has none (QwenLM/Qwen3-VL#126, DeepSpeed#7170: without a blank image through the tower
of the image-less rank, hf_lora_ds.vision.every_rank, ZeRO-3 over gloo aborts in the first such step, "Received data
size doesn't match expected size"; over NCCL it hangs).

One torchrun launch (``sft_entry.py --variant``) runs them all: 8 records, one with an image, one sample per rank
per step, so each epoch has exactly one step where one rank's batch has the image and the other's has none. Each
sharded run must log DDP's losses step for step (a collective paired with the wrong one would not), save an adapter
with trained ``lora_B`` tensors in the language model only, and the ZeRO-3 run resumed from its step-4 checkpoint
must run steps 5 and 6 only and end with the uninterrupted run's adapter and losses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from hf_lora_ds.model.adapter_check import verify_adapter
from tests.e2e.launching import (
    ENTRY,
    REPO,
    adapter_weights,
    check_ok,
    launcher,
    losses,
    rank_samples,
    recorded_steps,
    run,
    trainer_state,
    variant_args,
    variant_logs,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, RECORDS = 6, 8  # 4 steps an epoch of 2 ranks x 1 sample
LAUNCH_TIMEOUT_S = 420  # ~90 s measured; a hang shows as a failure here, not a stuck suite


@pytest.fixture(scope="module")
def vlm_data(tmp_path_factory) -> dict[str, Path]:
    from hf_lora_ds._testing.tiny_vlms import save_tiny_vlm

    root = tmp_path_factory.mktemp("vlm-launch")
    model = save_tiny_vlm("qwen2_5_vl", root / "model")
    (root / "img").mkdir()
    Image.new("RGB", (64, 64), (255, 0, 0)).save(root / "img" / "red.png")
    image_turn = [{"type": "image", "image": "img/red.png"}, {"type": "text", "text": "colour?"}]
    records = [[image_turn, "red"]] + [[f"{x}+1=", str(x + 1)] for x in range(1, RECORDS)]
    lines = [
        json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
        for user, answer in records
    ]
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    return {"model": Path(model), "train": root / "train.jsonl", "root": root}


@pytest.fixture(scope="module")
def launched(vlm_data) -> tuple[Path, dict[str, str]]:
    out = vlm_data["root"] / "runs"
    engines = {
        "ddp": "",
        "zero3": f"--deepspeed {REPO / 'ds_configs' / 'stage3.json'}",
        "zero2": f"--deepspeed {REPO / 'ds_configs' / 'stage2.json'}",
        "fsdp2": f"--fsdp full_shard --fsdp_config {REPO / 'fsdp_configs' / 'fsdp2.json'}",
    }
    variants = {
        **engines,
        "zero3_resumed": f"{engines['zero3']} --resume_from_checkpoint {out / 'zero3' / 'checkpoint-4'}",
    }
    args = [
        *("--model_name_or_path", str(vlm_data["model"]), "--train_file", str(vlm_data["train"]), "--eval_file", ""),
        *("--output_dir", str(out), "--dataset_cache_dir", str(vlm_data["root"] / "dataset-cache")),
        *("--max_steps", str(STEPS), "--per_device_train_batch_size", "1", "--save_strategy", "steps"),
        *("--save_steps", "2", "--learning_rate", "2e-2", "--lr_scheduler_type", "constant", "--warmup_steps", "0"),
        *("--logging_steps", "1", "--seed", "0", "--report_to", "none", "--disable_tqdm", "true"),
    ]
    command = launcher("torchrun", 2) + [str(ENTRY), *variant_args(variants), *args]
    launch = run(command, vlm_data["root"] / "launch.log", timeout=LAUNCH_TIMEOUT_S)
    check_ok(launch)
    print(f"{len(variants)} runs in {launch.seconds:.0f} s")
    return out, variant_logs(launch.log)


def test_images_on_one_rank_only_train_as_ddp_under_zero3_zero2_and_fsdp2(launched, vlm_data):
    out, logs = launched
    image_token = json.loads((vlm_data["model"] / "config.json").read_text())["image_token_id"]
    with_image = [sum(image_token in sample for sample in samples) for samples in rank_samples(out / "zero3", 2)]
    assert sorted(with_image) == [0, 1], with_image  # one rank saw the image, the other never
    reference = losses(out / "ddp")
    assert len(reference) == STEPS
    for engine, line in (("zero3", "ZeRO-3"), ("zero2", "ZeRO-2"), ("fsdp2", "FSDP2")):
        assert f"engine: {'DeepSpeed ' if 'ZeRO' in line else ''}{line}" in logs[engine], logs[engine][-2000:]
        assert trainer_state(out / engine)["global_step"] == STEPS
        assert losses(out / engine) == pytest.approx(reference, rel=1e-4), engine


@pytest.mark.parametrize("engine", ["zero3", "zero2", "fsdp2"])
def test_the_adapter_is_trained_in_the_language_model_only(launched, vlm_data, engine):
    out, _ = launched
    verify_adapter(out / engine, base_model=vlm_data["model"])
    weights = adapter_weights(out / engine)
    assert weights and all(".language_model." in name for name in weights), sorted(weights)[:4]
    untrained = [name for name, tensor in weights.items() if "lora_B" in name and not tensor.any()]
    assert not untrained, untrained


def test_zero3_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run(launched):
    out, logs = launched
    resumed, whole = out / "zero3_resumed", out / "zero3"
    assert recorded_steps(resumed, 2) == [{"start": 4, "completed": [5, 6]}] * 2
    assert trainer_state(resumed)["global_step"] == STEPS
    assert losses(resumed)[-2:] == pytest.approx(losses(whole)[-2:], rel=1e-5)
    expected, got = adapter_weights(whole), adapter_weights(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
