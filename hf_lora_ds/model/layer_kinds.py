"""What mixes tokens in a model besides attention: linear-attention (Gated DeltaNet, Kimi's delta attention,
MiniMax's lightning attention), state-space (Mamba) and short-convolution layers, found by what they are made of
rather than by family name.

Such a layer carries its state along the sequence through a causal depthwise convolution (``conv1d``/``conv``), a
decaying recurrence (Mamba's and the delta rule's ``A_log``, lightning attention's ``*_decay``), or both; on their
torch paths neither sees where one packed sample ends. Attention layers, which do, are not listed here.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import torch

__all__ = ["SequenceMixerKind", "sequence_mixers", "sequence_mixer_counts"]

SequenceMixerKind = Literal["linear attention", "state space", "short convolution"]


def sequence_mixers(model: torch.nn.Module) -> dict[str, SequenceMixerKind]:
    """Each non-attention token-mixing module of ``model`` (raw or wrapped by PEFT) by its name, with its kind."""
    owners = [
        name
        for name, module in model.named_modules()
        if not _inside_lora_layer(name) and (any(map(_is_depthwise_conv, module.children())) or _decays(module))
    ]
    # The outermost owner is the layer (Kimi's delta attention keeps its decay in a gate inside it).
    outermost = [name for name in owners if not any(name.startswith(f"{other}.") for other in owners)]
    return {name: _kind(model.get_submodule(name)) for name in outermost}


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


def _decays(module: torch.nn.Module) -> bool:
    """Whether ``module`` itself holds a recurrence's decay (a parameter or buffer, not one of its children's)."""
    own = [name for name, _ in (*module.named_parameters(recurse=False), *module.named_buffers(recurse=False))]
    return any(name == "A_log" or "decay" in name for name in own)


def _kind(module: torch.nn.Module) -> SequenceMixerKind:
    """Mamba keeps its skip ``D`` beside the decay ``A_log``; linear attention has the decay alone; a short
    convolution neither."""
    own = {name for name, _ in module.named_parameters(recurse=False)}
    if {"A_log", "D"} <= own:
        return "state space"
    inside = [name for name, _ in (*module.named_parameters(), *module.named_buffers())]
    return "linear attention" if any("A_log" in name or "decay" in name for name in inside) else "short convolution"
