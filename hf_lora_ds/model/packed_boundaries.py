"""Whether a model's linear-attention, state-space and short-convolution layers keep packed samples apart.

Attention reads where one packed sample ends from the restarting ``position_ids``; these layers do not. Their torch
paths in transformers (``torch_chunk_gated_delta_rule``, the ``causal_conv1d_fn`` fallback, ``mamba2_chunk_scan``,
``mamba_selective_scan``) take no boundaries at all, so a packed sample's state and convolution window start from
the sample before it. The CUDA kernels take them (``seq_idx`` for causal-conv1d and mamba-ssm, ``cu_seqlens`` for
flash-linear-attention), and transformers 5.24 forwards them from the batch's keyword arguments for the families in
``_BOUNDARY_KERNELS`` (see there). Only those families, on CUDA, with every kernel they call importable, may pack.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch

from hf_lora_ds.model.layer_kinds import SequenceMixerKind, sequence_mixers

__all__ = ["packed_batch_keys", "packing_refusal"]

_CONV = "causal_conv1d"
_MAMBA2 = ("mamba_ssm.ops.triton.ssd_combined", _CONV)  # mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined
_DELTA_RULE = ("fla.ops.gated_delta_rule", _CONV)  # chunk_gated_delta_rule
# By modeling module: the kernel modules its mixers call, and the batch keys it forwards to them. Each family's decoder
# layer hands its **kwargs to the mixer, which hands them to causal_conv1d_fn and the Mamba-2 scans (seq_idx; e.g.
# modeling_bamba.py:697, 731, 787) or pops cu_seq_lens_q into chunk_gated_delta_rule (modeling_qwen3_5.py:641,
# modeling_qwen3_next.py:752). Jamba is absent: its Mamba decoder layer passes no kwargs to the mixer
# (modeling_jamba.py:793) and mamba-ssm's selective scan takes no boundaries.
_BOUNDARY_KERNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "bamba": (_MAMBA2, ("seq_idx",)),
    "granitemoehybrid": (_MAMBA2, ("seq_idx",)),
    "nemotron_h": (_MAMBA2, ("seq_idx",)),
    "falcon_h1": (_MAMBA2, ("seq_idx",)),
    "lfm2": ((_CONV,), ("seq_idx",)),
    "qwen3_5": (_DELTA_RULE, ("seq_idx", "cu_seq_lens_q")),
    "qwen3_next": (_DELTA_RULE, ("seq_idx", "cu_seq_lens_q")),
}


def packed_batch_keys(model: torch.nn.Module) -> tuple[str, ...] | None:
    """The boundary keys a packed or padding-free batch must carry for ``model``'s non-attention layers to keep its
    samples apart: ``()`` for a model of attention layers only, None where they cannot on this machine."""
    mixers = sequence_mixers(model)
    if not mixers:
        return ()
    families = {_family(model.get_submodule(name)) for name in mixers}
    if len(families) != 1 or (family := families.pop()) not in _BOUNDARY_KERNELS:
        return None
    modules, keys = _BOUNDARY_KERNELS[family]
    return keys if kernels_present(modules) else None


def kernels_present(modules: Sequence[str]) -> bool:
    """CUDA, and every kernel module importable, as transformers imports them when its modeling file loads."""
    if not torch.cuda.is_available():
        return False
    try:
        for module in modules:
            importlib.import_module(module)
    except Exception:  # a kernel built for another torch or CUDA fails on import, and transformers falls back
        return False
    return True


def packing_refusal(batching: str, model: torch.nn.Module) -> str | None:
    """The one line refusing ``--batching packed``/``padding_free`` for ``model``, or None where it may pack."""
    if batching not in ("packed", "padding_free") or packed_batch_keys(model) is not None:
        return None
    mixers = sequence_mixers(model)
    kinds = list(dict.fromkeys(mixers.values()))
    names = [name for name in mixers if mixers[name] == kinds[0]]
    shown = ", ".join(names[:2]) + (", …" if len(names) > 2 else "")
    return (
        f"--batching {batching}: this model's {_layers(kinds)} ({shown}) do not see where one packed sample ends "
        "on this machine; use --batching padded"
    )


def _family(module: torch.nn.Module) -> str:
    """``bamba`` for ``transformers.models.bamba.modeling_bamba``: the family whose code the layer runs."""
    return type(module).__module__.rpartition(".")[2].removeprefix("modeling_")


def _layers(kinds: list[SequenceMixerKind]) -> str:
    return " and ".join(kind.replace(" ", "-") for kind in kinds) + " layers"
