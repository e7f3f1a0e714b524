"""One plan: every shipped configuration (no DeepSpeed, each ``ds_configs/*.json``), with and without gradient
checkpointing, estimated for the run's model, batch, sequence lengths and world, then the recommendation.

The recommendation is the first configuration that fits in this order: less communication and offload first
(no DeepSpeed, ZeRO-0, 1, 2, 3, then the offload configs), and at each, without gradient checkpointing (which
recomputes the forward in backward, ~1/3 more compute) before with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch
from peft import LoraConfig
from transformers import PretrainedConfig

from hf_lora_ds.plan.estimate import CUDA_CONTEXT_BYTES, BatchShape, DeepSpeedLayout, Estimate, estimate_memory
from hf_lora_ds.plan.model_shape import ModelShape, measure_model_shape
from hf_lora_ds.resources import DEEPSPEED_CONFIGS, FSDP_CONFIGS

__all__ = [
    "PlanRow",
    "fits_with_more_devices",
    "sequence_parallel_sizes",
    "PlanSettings",
    "SequenceProfile",
    "make_plan",
    "recommend",
    "shipped_configs",
    "is_fsdp",
    "runtime_bytes",
]

SHIPPED_CONFIGS_DIR = DEEPSPEED_CONFIGS
# FSDP2 rows come last: --deepspeed auto and the recommendation pick DeepSpeed first, FSDP is a row to compare.
_SPEED_ORDER = (
    "none",
    "stage0",
    "stage1",
    "stage2",
    "stage3",
    "stage2_offload",
    "stage3_offload",
    "fsdp2",
    "fsdp2_offload",
)
_MAX_BATCH_SEARCH = 1 << 14


@dataclass(frozen=True)
class SequenceProfile:
    """Tokenized lengths and supervised-token counts of the training samples (after truncation), each sorted from
    the largest, or a single ``max_length`` standing for samples of unknown length (every position then counts as
    supervised: the bound)."""

    longest_first: tuple[int, ...]
    most_supervised_first: tuple[int, ...]
    known: bool = True
    # A vision-language model's data: each image's tokens, largest first. The lengths above already hold them; the
    # count per image is what the vision tower sees at once.
    image_tokens_first: tuple[int, ...] = ()

    @classmethod
    def from_samples(
        cls, lengths: Iterable[int], supervised: Iterable[int], image_tokens: Iterable[int] = ()
    ) -> SequenceProfile:
        return cls(
            tuple(sorted(lengths, reverse=True)),
            tuple(sorted(supervised, reverse=True)),
            image_tokens_first=tuple(sorted(image_tokens, reverse=True)),
        )

    @classmethod
    def unknown(cls, max_length: int) -> SequenceProfile:
        return cls((max_length,), (max_length,), known=False)

    def line(self) -> str:
        """What the plan knows of the data: ``data: 2520 samples, longest 57 tokens, ...``, and a vision-language
        model's images: ``; images: 320, at most 4 tokens each, 1280 in all``."""
        if not self.known:
            return f"data: not tokenized here (no tokenizer): every sample taken as {self.longest_first[0]} tokens"
        images = self.image_tokens_first
        return (
            f"data: {len(self.longest_first)} samples, longest {self.longest_first[0]} tokens, at most "
            f"{self.most_supervised_first[0]} supervised"
        ) + (f"; images: {len(images)}, at most {images[0]} tokens each, {sum(images)} in all" if images else "")

    def worst_batch(self, batch_size: int, padding_free: bool, packed_length: int | None = None) -> BatchShape:
        """The micro-batch that needs the most memory: the longest samples together (length grouping puts them
        together; random order can too); with packing, ``batch_size`` full rows of ``packed_length`` tokens, with
        as many supervised tokens as the data has, at most all of them."""
        longest, most_supervised = self.longest_first, self.most_supervised_first
        if packed_length is not None:
            tokens = batch_size * packed_length
            return BatchShape(
                rows=batch_size, row_tokens=packed_length, supervised_tokens=min(tokens, sum(most_supervised))
            )
        missing = max(0, batch_size - len(longest))  # a batch larger than the data: repeat the longest
        tokens = sum(longest[:batch_size]) + missing * longest[0]
        supervised = sum(most_supervised[:batch_size]) + missing * most_supervised[0]
        if padding_free:
            return BatchShape(rows=1, row_tokens=tokens, supervised_tokens=supervised)
        return BatchShape(rows=batch_size, row_tokens=longest[0], supervised_tokens=supervised)


@dataclass(frozen=True)
class PlanSettings:
    """Everything about the run the estimate reads, besides the model."""

    model_config: PretrainedConfig
    lora: LoraConfig
    dtype: torch.dtype
    batch_size: int
    profile: SequenceProfile
    world_size: int
    ranks_per_node: int
    device_memory: int  # bytes per device; on a CPU-only machine the host memory the ranks share
    host_memory: int | None  # bytes per node; None: not checked (planning for machines other than this one)
    on_accelerator: bool
    headroom: float = 0.1
    attn_implementation: str | None = None
    quantization: str | None = None  # "4bit", "8bit" or None
    padding_free: bool = False
    supervised_logits_only: bool = True
    lora_optimizer: str = "adamw"  # "lorafa": A frozen (hf_lora_ds.training.lora_optimizers)
    packed_length: int | None = None  # --batching packed: rows of this many tokens
    sequence_parallel: int = 1  # the run's; larger sizes are planned when nothing fits at it


def sequence_parallel_sizes(settings: PlanSettings, largest: int | None = None) -> list[int]:
    """Sizes above the run's that Ulysses can split this model over: dividing the world (``largest`` ranks: the
    planned world by default) and the attention heads, and dividing or divided by the key/value heads."""
    text = settings.model_config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    largest = settings.world_size if largest is None else largest
    return [
        size
        for size in range(settings.sequence_parallel + 1, largest + 1)
        if largest % size == 0 and heads % size == 0 and (kv_heads % size == 0 or size % kv_heads == 0)
    ]


@dataclass(frozen=True)
class PlanRow:
    config: str  # a shipped config's file name, or "none"
    gradient_checkpointing: bool
    estimate: Estimate
    fits: bool
    margin_bytes: int  # usable device memory minus the estimate (negative: short by that much)
    max_batch_size: int
    sequence_parallel: int = 1  # ranks each sequence is split over (DeepSpeed Ulysses)

    def as_json(self) -> dict:
        return {
            "config": self.config,
            "gradient_checkpointing": self.gradient_checkpointing,
            "sequence_parallel": self.sequence_parallel,
            "device_bytes": self.estimate.device_bytes,
            "host_bytes": self.estimate.host_bytes,
            "fits": self.fits,
            "margin_bytes": self.margin_bytes,
            "max_batch_size": self.max_batch_size,
            "device_items": self.estimate.device_items,
            "host_items": self.estimate.host_items,
        }


def shipped_configs(directory: Path = SHIPPED_CONFIGS_DIR) -> dict[str, dict | None]:
    """``{"none": None, "stage0.json": {...}, ..., "fsdp2.json": {"fsdp": {...}}}`` in the recommendation's order:
    the DeepSpeed configs as they are, the FSDP2 ones (``fsdp_configs/``) under an ``fsdp`` key."""
    configs: dict[str, dict | None] = {"none": None}
    for path in sorted(directory.glob("*.json"), key=lambda p: _rank(p.stem)):
        configs[path.name] = json.loads(path.read_text(encoding="utf-8"))
    for path in sorted(FSDP_CONFIGS.glob("*.json"), key=lambda p: _rank(p.stem)):
        configs[path.name] = {"fsdp": json.loads(path.read_text(encoding="utf-8"))}
    return configs


def is_fsdp(config: dict | None) -> bool:
    """Whether a planned configuration is FSDP2 (``{"fsdp": settings}``) rather than a DeepSpeed config."""
    return config is not None and "fsdp" in config


def _rank(name: str) -> int:
    return _SPEED_ORDER.index(name) if name in _SPEED_ORDER else len(_SPEED_ORDER)


def runtime_bytes(on_accelerator: bool) -> int:
    """A CUDA context on an accelerator; on a CPU the resident memory of this process, which has imported the same
    libraries a training process does (the planner runs inside run_sft, or as ``python -m hf_lora_ds.plan``)."""
    return CUDA_CONTEXT_BYTES if on_accelerator else psutil.Process(os.getpid()).memory_info().rss


def make_plan(settings: PlanSettings, configs: dict[str, dict | None], runtime: int) -> list[PlanRow]:
    """One row per configuration and gradient-checkpointing setting, in the recommendation's order, at the run's
    sequence-parallel size; when none fits (a sequence too long for one device), the DeepSpeed configurations again
    at each larger size the world and the model allow."""
    rows = _rows(settings, configs, runtime, settings.sequence_parallel)
    if not any(row.fits for row in rows):
        deepspeed = {name: config for name, config in configs.items() if config is not None and not is_fsdp(config)}
        for size in sequence_parallel_sizes(settings):
            rows += _rows(settings, deepspeed, runtime, size)
    return sorted(
        rows,
        key=lambda row: (row.sequence_parallel, _rank(row.config.removesuffix(".json")), row.gradient_checkpointing),
    )


def fits_with_more_devices(
    settings: PlanSettings, configs: dict[str, dict | None], runtime: int, most: int = 64
) -> PlanRow | None:
    """For a sequence nothing fits even split over the planned world: the first row that fits on a world of one
    sequence-parallel group of the smallest size that does, up to ``most`` devices of the planned memory (on a CPU,
    machines like the planned one: ranks on one machine share its memory, so only more machines add any)."""
    deepspeed = {name: config for name, config in configs.items() if config is not None and not is_fsdp(config)}
    for size in sequence_parallel_sizes(replace(settings, sequence_parallel=1), largest=most):
        if size <= settings.world_size:
            continue
        world = replace(
            settings,
            world_size=size,
            ranks_per_node=min(size, settings.ranks_per_node) if settings.on_accelerator else 1,
        )
        fitting = recommend(
            sorted(
                _rows(world, deepspeed, runtime, size),
                key=lambda row: (_rank(row.config.removesuffix(".json")), row.gradient_checkpointing),
            )
        )
        if fitting is not None:
            return fitting
    return None


def _model_shape(settings: PlanSettings, layout: DeepSpeedLayout) -> ModelShape:
    """The model's shape as the configuration trains it: DeepSpeed casts the adapters to the compute dtype (in fp32
    they are already). Measured once per process for each."""
    return measure_model_shape(
        settings.model_config,
        settings.lora,
        settings.dtype,
        settings.profile.worst_batch(1, padding_free=False).row_tokens,
        settings.attn_implementation,
        settings.quantization,
        adapters_in_compute_dtype=layout.stage is not None and settings.dtype.itemsize < 4,
        train_lora_a=settings.lora_optimizer != "lorafa",
        on_accelerator=settings.on_accelerator,
    )


def _rows(
    settings: PlanSettings, configs: dict[str, dict | None], runtime: int, sequence_parallel: int
) -> list[PlanRow]:
    layouts = {name: DeepSpeedLayout.from_config(config) for name, config in configs.items()}
    return [
        _row(_model_shape(settings, layout), settings, name, layout, checkpointing, runtime, sequence_parallel)
        for name, layout in layouts.items()
        for checkpointing in (False, True)
    ]


def _row(
    shape: ModelShape,
    settings: PlanSettings,
    name: str,
    layout: DeepSpeedLayout,
    gc: bool,
    runtime: int,
    sequence_parallel: int = 1,
) -> PlanRow:
    def estimate(batch_size: int) -> Estimate:
        return estimate_memory(
            shape,
            settings.profile.worst_batch(batch_size, settings.padding_free, settings.packed_length),
            layout,
            world_size=settings.world_size,
            ranks_per_node=settings.ranks_per_node,
            weight_bytes=settings.dtype.itemsize,
            gradient_checkpointing=gc,
            supervised_logits_only=settings.supervised_logits_only,
            on_accelerator=settings.on_accelerator,
            runtime_bytes=runtime,
            sequence_parallel=sequence_parallel,
        )

    def margin(found: Estimate) -> int:
        return int(min(_usable_device(settings) - found.device_bytes, _usable_host(settings) - found.host_bytes))

    chosen = estimate(settings.batch_size)
    largest = 0
    while largest < _MAX_BATCH_SEARCH and margin(estimate(max(1, largest * 2))) >= 0:
        largest = max(1, largest * 2)
    step = largest // 2
    while step >= 1:  # binary search between the last doubling that fitted and the one that did not
        if largest + step <= _MAX_BATCH_SEARCH and margin(estimate(largest + step)) >= 0:
            largest += step
        step //= 2
    return PlanRow(name, gc, chosen, margin(chosen) >= 0, margin(chosen), largest, sequence_parallel)


def _usable_device(settings: PlanSettings) -> int:
    usable = int(settings.device_memory * (1 - settings.headroom))
    return usable if settings.on_accelerator else usable // settings.ranks_per_node


def _usable_host(settings: PlanSettings) -> float:
    if settings.host_memory is None:
        return float("inf")
    return int(settings.host_memory * (1 - settings.headroom))


def recommend(rows: Sequence[PlanRow]) -> PlanRow | None:
    """The first row that fits (rows come in the recommendation's order), or None."""
    return next((row for row in rows if row.fits), None)
