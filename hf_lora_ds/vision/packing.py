"""Packed rows for Qwen-VL: each sample's 3-D rotary positions from the model's own rope index, a text row in front.

Qwen-VL places an image's tokens on a (time, height, width) grid: its rotary positions are three rows, computed by the
model's ``get_rope_index`` from the ids and the images' grids. Packed samples need them per sample (a packed row
given to it whole would number the second sample after the first: trained on the wrong positions, silently). So each
sample of a row is indexed on its own, and the 1-D positions restarting per sample go in front as a fourth row,
which transformers reads to keep the samples apart in attention (Qwen2.5-VL's text model: ``text_position_ids``).
A family whose positions are not such a function of one sample is not packed (``hf_lora_ds.vision.families``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hf_lora_ds.errors import UserError

__all__ = ["packed_rope_index", "packed_rope_positions"]

RopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def packed_rope_positions(
    rope_index: RopeIndex,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> torch.Tensor:
    """``(4, batch, length)`` positions of packed rows: the 1-D ``position_ids`` (restarting at each sample), then each
    sample's three rotary rows from ``rope_index``, given the sample's own images' grids (in order: each run of image
    tokens is one image)."""
    rows = torch.zeros((3, *input_ids.shape), dtype=torch.long)
    next_image = 0
    for b in range(input_ids.shape[0]):
        starts = (position_ids[b] == 0).nonzero().flatten().tolist() + [input_ids.shape[1]]
        for start, end in zip(starts, starts[1:]):
            types = mm_token_type_ids[b, start:end]
            images = int(((types == 1) & (torch.nn.functional.pad(types, (1, 0))[:-1] != 1)).sum())
            grids = None if images == 0 else image_grid_thw[next_image : next_image + images]
            next_image += images
            positions, _ = rope_index(
                input_ids[b : b + 1, start:end], mm_token_type_ids=types[None], image_grid_thw=grids
            )
            rows[:, b, start:end] = positions[:, 0]
    return torch.cat([position_ids[None], rows])


def packed_rope_index(batching: str, model: torch.nn.Module) -> RopeIndex | None:
    """The model's rope index where ``batching`` packs or flattens image samples (None for padded batches, whose
    positions the model computes itself); a vision-language model without one is refused in one line."""
    if batching == "padded":
        return None
    owner = next((module for module in model.modules() if hasattr(type(module), "get_rope_index")), None)
    if owner is None:
        raise UserError(
            f"--batching {batching}: image samples are packed exactly only for Qwen-VL models (their positions come "
            f"from the model's rope index per sample); {type(model).__name__} is not proven so: use --batching padded"
        )
    return owner.get_rope_index
