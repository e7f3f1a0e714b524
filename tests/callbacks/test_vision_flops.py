"""A vision-language model's training FLOPs as the throughput callback counts them (the language model per token,
image tokens included; the tower and projector per image, as they ran) against torch's FlopCounterMode over a real
training step.

The tower's and projector's part of the measured FLOPs is not FlopCounterMode's count by module: its module tracker
enters a module in the backward once the gradients of all the module's outputs have arrived and leaves it once those of
its inputs have, so Qwen3-VL's merger runs its backward before the tower is entered (the tower's deepstack outputs get
their gradients later) and goes uncounted in the tower, and a module whose inputs need no gradient (a trained projector
after a frozen tower) is never left, taking the backward of what runs after it. ``_VisionOps`` counts, with the same
formulas, the ops that run inside the tower's and projector's forward and the backward ops of the autograd nodes that
forward made."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from hf_lora_ds._testing.tiny_vlms import VLM_FAMILIES, build_tiny_vlm, tiny_image
from hf_lora_ds.callbacks.throughput import flops_per_token, flops_shape
from hf_lora_ds.callbacks.vision_flops import VisionFlops
from hf_lora_ds.config.vision import VisionMode, VisionTraining
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.modules import vision_parts


def _step_batch(processor) -> dict:
    """Two chats, an image each, of different sizes (a native-resolution tower sees different patch counts)."""
    image_text = ImageEncoding.of(processor).image_text
    texts = [f"{image_text}which colour? red", f"{image_text}how many dots? three dots here"]
    images = [[tiny_image(0, 64)], [tiny_image(1, 64).resize((64, 48))]]
    return dict(processor(text=texts, images=images, return_tensors="pt", padding=True))


class _VisionOps(TorchDispatchMode):
    """The FLOPs of the ops that ``roots`` (modules) run: forward ops while one of them runs, backward ops of the
    autograd nodes made meanwhile (told by their sequence numbers, which count up as a thread makes nodes)."""

    def __init__(self, roots: list[nn.Module]) -> None:
        super().__init__()
        self.flops = 0
        self._running = 0
        self._spans: list[list[int]] = []
        self._handles = [handle for root in roots for handle in self._hook(root)]

    def _hook(self, root: nn.Module) -> list:
        def enter(_module, _args) -> None:
            self._running += 1
            self._spans.append([_next_sequence_nr(), -1])

        def leave(_module, _args, _output) -> None:
            self._running -= 1
            self._spans[-1][1] = _next_sequence_nr()

        return [root.register_forward_pre_hook(enter), root.register_forward_hook(leave, always_call=True)]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket in flop_registry and self._made_here():
            self.flops += flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)
        return out

    def _made_here(self) -> bool:
        if self._running:
            return True
        node = torch._C._current_autograd_node()  # None outside a backward
        return node is not None and any(start < node._sequence_nr() < end for start, end in self._spans)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _next_sequence_nr() -> int:
    """The sequence number of an autograd node made now: a node made later has a greater one."""
    with torch.enable_grad():
        return torch.zeros((), requires_grad=True).neg().grad_fn._sequence_nr()


def _counted_and_measured(family: str, train_projector: VisionMode = "off") -> tuple[float, float, int, int]:
    """(the callback's FLOPs of one step, FlopCounterMode's, the vision hooks' part, the FLOPs of the tower's and
    projector's ops)."""
    torch.manual_seed(0)
    model, processor = build_tiny_vlm(family)
    model.set_attn_implementation("eager")  # attention as matmuls FlopCounterMode sees
    training = VisionTraining("off", train_projector)
    model = wrap_with_lora(model, LoraConfig(r=4, target_modules="all-linear"), training)
    batch = _step_batch(processor)
    vision = VisionFlops(model)
    model.train()
    parts = vision_parts(model)
    roots = [parts.tower, *(name for name in parts.projectors if not name.startswith(parts.tower + "."))]
    vision_ops = _VisionOps([model.get_submodule(root) for root in roots])
    with FlopCounterMode(display=False) as counter, vision_ops:
        model(**batch, labels=batch["input_ids"]).loss.backward()
    vision_ops.remove()
    tokens = batch["input_ids"].numel()  # no padding counted as a real token matters here: rows are equal or padded
    tower = vision.take()
    counted = tokens * flops_per_token(flops_shape(model), batch["input_ids"].shape[1]) + tower
    return counted, counter.get_total_flops(), tower, vision_ops.flops


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_a_vlm_training_step_s_flops_match_torch_s_flop_counter(family):
    """The tower and projector exactly (a frozen tower: forward only); the whole step within 5% (the language
    model's per-token formula is measured within 3% of a text model's, see test_throughput)."""
    counted, measured, tower, measured_tower = _counted_and_measured(family)
    assert tower == measured_tower > 0
    assert counted == pytest.approx(measured, rel=0.05)


# A projector inside the tower (Qwen-VL's merger, Qwen3-VL's deepstack mergers), and beside it (the others).
# Gemma 3's projector multiplies by its weight without a Linear: LoRA has nothing to adapt there.
@pytest.mark.parametrize(
    ("family", "mode"),
    [(family, mode) for family in VLM_FAMILIES for mode in ("full", "lora") if (family, mode) != ("gemma3", "lora")],
)
def test_a_trained_projector_s_backward_is_counted(family, mode):
    frozen = _counted_and_measured(family)
    counted, measured, tower, measured_tower = _counted_and_measured(family, train_projector=mode)
    assert tower == measured_tower > frozen[2]
    assert counted == pytest.approx(measured, rel=0.05)
