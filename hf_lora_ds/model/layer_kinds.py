"""What mixes tokens in a model besides attention: linear-attention (Gated DeltaNet), state-space (Mamba) and
short-convolution layers, found by what they are made of rather than by family name.

Every such layer transformers ships carries its state along the sequence through a causal depthwise convolution
(``conv1d``/``conv``) and, for linear attention and Mamba, a recurrence; on their torch paths neither sees where one
packed sample ends. Attention layers, which do, are not listed here.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import torch

__all__ = ["SequenceMixerKind", "sequence_mixers", "sequence_mixer_counts"]

SequenceMixerKind = Literal["linear attention", "state space", "short convolution"]


def sequence_mixers(model: torch.nn.Module) -> dict[str, SequenceMixerKind]:
    """Each non-attention token-mixing module of ``model`` (raw or wrapped by PEFT) by its name, with its kind."""
    mixers: dict[str, SequenceMixerKind] = {}
    for name, module in model.named_modules():
        if _is_depthwise_conv(module) and not _inside_lora_layer(name):
            owner = name.rpartition(".")[0]
            mixers[owner] = _kind(model.get_submodule(owner))
    return mixers


def sequence_mixer_counts(model: torch.nn.Module) -> Counter[SequenceMixerKind]:
    """How many layers of each non-attention kind ``model`` has (empty for a model of attention layers only)."""
    return Counter(sequence_mixers(model).values())


def _is_depthwise_conv(module: torch.nn.Module) -> bool:
    """A 1-D convolution with one filter group per channel, also when a LoRA layer wraps it."""
    conv = getattr(module, "base_layer", module)
    return isinstance(conv, torch.nn.Conv1d) and conv.groups == conv.in_channels > 1


def _inside_lora_layer(name: str) -> bool:
    """A LoRA layer's base layer and its adapters are parts of the layer it wraps, not layers of their own."""
    return any(part == "base_layer" or part.startswith("lora_") for part in name.split("."))


def _kind(module: torch.nn.Module) -> SequenceMixerKind:
    """Gated DeltaNet and Mamba both keep a decay ``A_log``; only the first is named for its delta rule."""
    if not hasattr(module, "A_log"):
        return "short convolution"
    return "linear attention" if "DeltaNet" in type(module).__name__ else "state space"
