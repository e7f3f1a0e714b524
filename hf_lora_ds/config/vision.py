"""How a vision-language model's vision side trains: its vision tower and its projector (the layers that map image
features into the language model's embeddings), each frozen, adapted with LoRA or trained in full.

Both are frozen by default, as LLaMA-Factory and ms-swift do: the language model learns to read the image features it
already gets, which is what most fine-tunes need, and a frozen tower costs no backward. The LoRA targets
(``--lora_target_modules``) reach a vision module only when its part is set to ``lora`` here
(hf_lora_ds.vision.modules)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from hf_lora_ds.errors import UserError
from hf_lora_ds.vision.resolution import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # the whole run: these checks read across parts

__all__ = ["FROZEN_VISION", "VisionArguments", "VisionMode", "VisionTraining", "check_vision_fields", "vision_training"]

VisionMode = Literal["off", "lora", "full"]
_MODES = get_args(VisionMode)
_HELP = (
    "off (default): frozen, run without an autograd graph; lora: adapted with LoRA where --lora_target_modules "
    "names its layers (all-linear: every linear layer in it); full: every weight trained, saved with the adapter "
    "(PEFT's modules_to_save). Text-only models ignore it."
)


@dataclass
class VisionArguments:
    """Vision-language models: which parts of the vision side train, and how."""

    train_vision_tower: VisionMode = field(
        default="off", metadata={"help": f"The vision tower (image encoder) of a vision-language model. {_HELP}"}
    )
    train_projector: VisionMode = field(
        default="off",
        metadata={
            "help": "The projector of a vision-language model (multi_modal_projector, SmolVLM's connector, Qwen-VL's "
            f"merger and Qwen3-VL's deepstack mergers): the layers that map image features into the language "
            f"model. {_HELP}"
        },
    )

    image_max_pixels: int = field(
        default=DEFAULT_MAX_PIXELS,
        metadata={
            "help": "Images with more pixels are scaled down, keeping their aspect ratio, before the processor sees "
            "them: bounds each image's tokens (a 12 MP photo is ~15,500 Qwen-VL tokens at the processor's own "
            f"limit). Default {DEFAULT_MAX_PIXELS} (768 x 768)."
        },
    )
    image_min_pixels: int = field(
        default=DEFAULT_MIN_PIXELS,
        metadata={"help": f"Images with fewer pixels are scaled up. Default {DEFAULT_MIN_PIXELS} (32 x 32)."},
    )


@dataclass(frozen=True)
class VisionTraining:
    """The two choices together, as the model code takes them."""

    tower: VisionMode = "off"
    projector: VisionMode = "off"


FROZEN_VISION = VisionTraining()


def vision_training(args: SFTTrainingArguments) -> VisionTraining:
    """The run's choices for the vision side."""
    return VisionTraining(args.train_vision_tower, args.train_projector)


def check_vision_fields(args: SFTTrainingArguments) -> None:
    """Each choice one of the modes (the command line's parser checks this; code that builds the arguments does not)."""
    for flag in ("train_vision_tower", "train_projector"):
        value = getattr(args, flag)
        if value not in _MODES:
            raise UserError(f"--{flag} {value}: use one of {', '.join(_MODES)}")
    if not 0 < args.image_min_pixels <= args.image_max_pixels:
        raise UserError(
            f"--image_min_pixels {args.image_min_pixels} and --image_max_pixels {args.image_max_pixels}: need "
            "0 < image_min_pixels <= image_max_pixels"
        )
