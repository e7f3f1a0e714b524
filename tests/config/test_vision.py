"""The vision fields: frozen by default, and a value that is no mode refused in one line naming the field."""

from __future__ import annotations

import pytest

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.vision import FROZEN_VISION, VisionTraining, check_vision_fields, vision_training
from hf_lora_ds.errors import UserError


def test_the_tower_and_projector_are_frozen_by_default():
    assert vision_training(SFTTrainingArguments.unbuilt()) == FROZEN_VISION == VisionTraining("off", "off")


def test_the_choices_travel_together():
    chosen = SFTTrainingArguments.unbuilt(train_vision_tower="lora", train_projector="full")
    assert vision_training(chosen) == VisionTraining("lora", "full")


@pytest.mark.parametrize("field", ["train_vision_tower", "train_projector"])
def test_a_value_that_is_no_mode_is_refused(field):
    with pytest.raises(UserError, match=f"^--{field} true: use one of off, lora, full$"):
        check_vision_fields(SFTTrainingArguments.unbuilt(**{field: "true"}))


def test_the_run_arguments_check_them(tmp_path):
    with pytest.raises(UserError, match='^train_projector="true": use one of off, lora, full$'):
        SFTTrainingArguments(output_dir=str(tmp_path), train_projector="true")


def test_pixel_bounds_that_contradict_each_other_are_refused(tmp_path):
    with pytest.raises(UserError, match="image_min_pixels.*image_max_pixels"):
        SFTTrainingArguments(output_dir=str(tmp_path), image_max_pixels=1000, image_min_pixels=2000)
