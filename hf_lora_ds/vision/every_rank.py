"""The vision tower run in every forward of a multi-process run, on a blank image weighted 0 where a batch has none.

ZeRO-3 and FSDP gather a module's parameters as its forward begins (and reduce the gradients of a module that
trains in the backward): collectives every rank must call in the same order. A vision-language model runs its tower
only for a batch with images, so when one rank's batch has an image and another's has none, the first calls the
tower's gathers while the second calls the language model's: over gloo the job aborts ("Received data size doesn't
match expected size"), over NCCL it hangs (QwenLM/Qwen3-VL#126, DeepSpeed#7170). A tower or projector that trains
breaks the gradient reduction of DDP and ZeRO-1/2 the same way (a gradient on one rank only).

So in a multi-process run, a forward of the multimodal model without pixels runs the tower on one blank image at the
point where the real path runs it, after the input embeddings and before the language model (every family here:
embeddings, image features, language model; ZeRO-3 and FSDP see the same modules in the same order on every rank),
and adds ``0 * sum(features)`` to the language model's input embeddings: the same values (x + 0 is x), a zero
gradient into the tower and projector, and their backward run where they train. ms-swift pushes a dummy image
through the tower for the same reason; LLaMA-Factory adds a fake image, masked out, to the batch, which changes the
rows. Always in a multi-process run rather than only under ZeRO-3/FSDP: DDP and ZeRO-1/2 with a trained projector
or tower need it too, and a blank image through a frozen tower costs little beside a training step. A single
process has nothing to keep in step and runs none. Decoding steps of a filled cache are left alone: no rank passes
pixels there.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from transformers import ProcessorMixin

from hf_lora_ds.vision.collator import ProcessorOutputs
from hf_lora_ds.vision.modules import vision_parts

__all__ = ["BLANK_IMAGE_SIZE", "blank_image_pixels", "run_tower_in_every_forward"]

BLANK_IMAGE_SIZE = 32  # pixels a side: each family's processor resizes it up to its smallest image (Qwen-VL: 56)
_INSTALLED = "_hf_lora_ds_tower_in_every_forward"


def blank_image_pixels(processor: ProcessorMixin, outputs: ProcessorOutputs) -> dict[str, torch.Tensor]:
    """One black image's tensors, as the processor makes a batch's (``ProcessorOutputs.pixels``)."""
    blank = Image.new("RGB", (BLANK_IMAGE_SIZE, BLANK_IMAGE_SIZE))
    return outputs.pixels(processor, [[blank]])


@dataclass
class _Pending:
    """Whether the multimodal model's forward under way had no pixels, so its language model's call runs the blank
    image first."""

    blank: bool = False


def run_tower_in_every_forward(model: torch.nn.Module, pixels: dict[str, torch.Tensor]) -> bool:
    """Hooks on ``model`` (a vision-language model, PEFT-wrapped or not) that run the tower on ``pixels`` (one blank
    image: ``blank_image_pixels``) in each forward without pixels, weighted 0 (see the module docstring). False, and
    nothing done, for a text-only model or one whose image features are not reachable the same way; once per model."""
    parts = vision_parts(model)
    if parts is None or "." not in parts.language_model:
        return False
    holder_name, _ = parts.language_model.rsplit(".", 1)
    holder = model.get_submodule(holder_name)
    language_model = model.get_submodule(parts.language_model)
    if not hasattr(holder, "get_image_features"):
        return False
    if getattr(holder, _INSTALLED, False):
        return True
    accepted = inspect.signature(holder.get_image_features).parameters
    pixels = {key: value for key, value in pixels.items() if key in accepted}
    pending = _Pending()

    def before_model(_module: torch.nn.Module, _args: tuple, kwargs: dict) -> None:
        pending.blank = kwargs.get("pixel_values") is None and not _decoding(kwargs.get("past_key_values"))

    def before_language_model(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not pending.blank:
            return None
        pending.blank = False
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise RuntimeError(f"{type(holder).__name__} called its language model without inputs_embeds")
        on = {
            key: value.to(embeds.device, embeds.dtype if value.is_floating_point() else value.dtype)
            for key, value in pixels.items()
        }
        total = _sum_of_tensors(holder.get_image_features(**on))
        # nan_to_num: a non-finite feature must not turn 0 * it into NaN; x + 0 leaves every value as it was.
        kwargs["inputs_embeds"] = embeds + torch.nan_to_num(total, nan=0.0, posinf=0.0, neginf=0.0).to(embeds.dtype) * 0
        return args, kwargs

    holder.register_forward_pre_hook(before_model, with_kwargs=True)
    language_model.register_forward_pre_hook(before_language_model, with_kwargs=True)
    setattr(holder, _INSTALLED, True)
    return True


def _decoding(cache: Any) -> bool:
    """Whether a forward continues a filled cache (a decoding step of generation)."""
    length = getattr(cache, "get_seq_length", None)
    return length is not None and length() > 0


def _sum_of_tensors(output: Any) -> torch.Tensor:
    """The sum of every floating tensor in ``output`` (a tensor, a model output, nested tuples and lists), as one
    float32 scalar whose graph reaches each of them."""
    if isinstance(output, torch.Tensor):
        return output.float().sum() if output.is_floating_point() else torch.zeros(())
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, list | tuple) else ()
    total = torch.zeros(())
    for value in values:
        part = _sum_of_tensors(value)
        total = total.to(part.device) + part
    return total
