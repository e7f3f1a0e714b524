"""``python -m hf_lora_ds.audit`` on a vision-language base with image records: the processor built (no weight read),
images expanded as training expands them, each image's placeholders shown as one marker, image tokens counted and
none of them trained."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hf_lora_ds._testing.tiny_vlms import save_tiny_vlm, tiny_image
from hf_lora_ds.cli.audit import main


def _vlm_case(tmp_path: Path, family: str, images_per_record: int = 1) -> tuple[Path, Path]:
    """A tiny ``family`` checkpoint without its weights, and three records of images and a text-only one."""
    model = save_tiny_vlm(family, tmp_path / "model")
    for weights in model.glob("*.safetensors"):
        weights.unlink()  # the audit reads no weight
    (tmp_path / "img").mkdir()
    records = []
    for i in range(3):
        parts = []
        for k in range(images_per_record):
            tiny_image(i + k, 64).save(tmp_path / "img" / f"{i}-{k}.png")
            parts.append({"type": "image", "image": f"img/{i}-{k}.png"})
        content = [*parts, {"type": "text", "text": "colour?"}]
        records.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "red"}]})
    records.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(record) for record in records))
    return model, data


@pytest.mark.parametrize("family, per_image", [("qwen2_5_vl", 4), ("gemma3", 16)])
def test_the_audit_shows_each_image_as_one_marker_and_trains_none_of_its_tokens(tmp_path, capsys, family, per_image):
    model, data = _vlm_case(tmp_path, family, images_per_record=2)
    report = main(["--train_file", str(data), "--model_name_or_path", str(model), "--show_samples", "1"])
    out = capsys.readouterr().out
    assert (report.images.images, report.images.samples_with_images) == (6, 3)
    assert report.images.trained_image_tokens == 0 and report.images.image_tokens >= 6 * per_image
    assert "(none trained)" in out
    shown = out.split("--- sample 0")[1]
    assert re.findall(r"<image: (\d+) tokens>", shown) == [str(per_image)] * 2
    assert "<|image_pad|><|image_pad|>" not in out and "<image_soft_token><image_soft_token>" not in out
    assert "[[red" in shown


def test_the_jsonl_samples_mark_images_and_their_spans_still_point_at_the_answer(tmp_path, capsys):
    model, data = _vlm_case(tmp_path, "qwen2_5_vl")
    main(["--train_file", str(data), "--model_name_or_path", str(model), "--show_samples", "4"])
    capsys.readouterr()
    main(
        [
            "--train_file",
            str(data),
            "--model_name_or_path",
            str(model),
            "--show_samples",
            "4",
            "--show_samples_format",
            "jsonl",
        ]
    )
    samples = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "<|vision_start|><image: 4 tokens><|vision_end|>colour?" in samples[0]["text"]
    for sample in samples:
        ((start, end),) = sample["trained"]
        assert sample["text"][start:end] in ("red<|im_end|>", "hello<|im_end|>")
