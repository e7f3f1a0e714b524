"""What the trainer hands a vision-language model: the pixels of its image samples (Trainer's remove_unused_columns
dropped their image references before the collator, so the tower never ran), and, under ZeRO-3, the adapter check of
rank 0 alone built outside ``deepspeed.zero.Init`` (a collective: rank 0's check of a Qwen2.5-VL adapter hung)."""

from __future__ import annotations

import json

from peft import LoraConfig, get_peft_model
from PIL import Image

from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm, save_tiny_vlm
from hf_lora_ds.model.adapter_check import verify_adapter


def test_training_batches_carry_the_pixels_of_their_images(tmp_path):
    from hf_lora_ds import LoraSFTTrainer
    from hf_lora_ds.cli.run import parse_args

    model_dir = save_tiny_vlm("qwen2_5_vl", tmp_path / "model")
    Image.new("RGB", (64, 64), (255, 0, 0)).save(tmp_path / "red.png")
    image_turn = [{"type": "image", "image": "red.png"}, {"type": "text", "text": "colour?"}]
    records = [(image_turn, "red"), ("1+1=", "2"), (image_turn, "red")]
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
            + "\n"
            for user, answer in records
        )
    )
    args = parse_args(
        [
            *("--model_name_or_path", str(model_dir), "--train_file", str(tmp_path / "train.jsonl")),
            *("--eval_file", "", "--output_dir", str(tmp_path / "out"), "--report_to", "none"),
            *("--per_device_train_batch_size", "3", "--dataset_cache_dir", str(tmp_path / "cache")),
        ]
    )
    trainer = LoraSFTTrainer(args.model_name_or_path, args)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4]] * 2  # a 64 x 64 image is resized to 56 x 56: 4 x 4 patches
    assert batch["pixel_values"].shape[0] == 2 * 16


def test_a_vlm_adapter_is_checked_outside_zero_init_under_zero3(tmp_path, monkeypatch):
    """As tests/model/test_adapter_check.py's text model, with a Qwen2.5-VL base: its class builds its tower and
    language model with ``_from_config``, which would enter zero.Init on its own."""
    import deepspeed
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    base = save_tiny_vlm("qwen2_5_vl", tmp_path / "base")
    model, _ = build_tiny_vlm("qwen2_5_vl")
    get_peft_model(model, LoraConfig(r=4, target_modules=r".*language_model.*\.q_proj")).save_pretrained(tmp_path / "a")

    def refuse(*args, **kwargs):
        raise AssertionError("verify_adapter entered deepspeed.zero.Init: a collective only rank 0 calls")

    monkeypatch.setattr(deepspeed.zero, "Init", refuse)
    live = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    try:
        verify_adapter(tmp_path / "a", base_model=base)
    finally:
        del live
        unset_hf_deepspeed_config()
