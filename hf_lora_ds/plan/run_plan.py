"""The planner's entry: from a run's arguments (``SFTTrainingArguments``, or the same fields parsed without building
one) to a plan.

The planner reads the fields by name, so ``python -m hf_lora_ds.plan`` can parse run_sft's flags and YAML file
without constructing ``SFTTrainingArguments`` (whose checks start distributed state and need a data file), and
run_sft can plan with the arguments it already has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
from transformers.utils import logging

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.batching import resolve_batching
from hf_lora_ds.config.deepspeed import check_deepspeed_config
from hf_lora_ds.config.engine import Engine, data_parallel_size
from hf_lora_ds.config.fsdp import fsdp_settings
from hf_lora_ds.data.run_data import load_run_data, sft_dataset
from hf_lora_ds.devices import auto_dtype
from hf_lora_ds.distributed import launcher_ranks_per_node, launcher_world_size
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.loading import base_model_config, load_run_processor, load_tokenizer
from hf_lora_ds.model.lora import lora_config_from_args
from hf_lora_ds.plan.planner import (
    SHIPPED_CONFIGS_DIR,
    PlanRow,
    PlanSettings,
    SequenceProfile,
    fits_with_more_devices,
    is_fsdp,
    make_plan,
    recommend,
    runtime_bytes,
    shipped_configs,
)
from hf_lora_ds.plan.table import plan_line
from hf_lora_ds.vision.images import image_size
from hf_lora_ds.vision.token_count import ImageTokens

__all__ = [
    "PlanArguments",
    "config_name",
    "configs_with",
    "fsdp_config_name",
    "parse_memory",
    "plan_run",
    "plan_with_more_devices",
    "check_run_fits",
    "plan_this_run",
    "planning_line",
    "plans_accelerator",
    "profile_from_dataset",
    "recommended_deepspeed_config",
    "run_world",
    "sequence_profile",
]

logger = logging.get_logger(__name__)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}


@dataclass
class PlanArguments:
    """The planner's own flags; every other flag is run_sft's."""

    world_size: int | None = field(
        default=None, metadata={"help": "Devices in all: nnodes x nproc_per_node unless given."}
    )
    nnodes: int = field(default=1, metadata={"help": "Machines the run spans."})
    nproc_per_node: int | None = field(
        default=None, metadata={"help": "Devices (ranks) per machine. Default: the accelerators visible here, else 1."}
    )
    device: str = field(
        default="auto",
        metadata={
            "help": "What the ranks train on: 'gpu' (accelerators of --device_memory each), 'cpu' (the host's "
            "memory, shared by the ranks), 'auto': this machine's kind, except that --device_memory given on a "
            "machine without an accelerator plans for GPUs of that memory.",
            "choices": ["auto", "gpu", "cpu"],
        },
    )
    host_memory: str | None = field(
        default=None,
        metadata={
            "help": "Host RAM per machine (for offload and loading). Default: this machine's when planning for "
            "its own kind of device, else unchecked."
        },
    )
    headroom: float = field(
        default=0.1, metadata={"help": "Fraction of memory kept free: a configuration fits within the rest."}
    )
    json: bool = field(default=False, metadata={"help": "Print the rows as a JSON list instead of the table."})


def parse_memory(text: str, flag: str) -> int:
    """``"24GiB"`` -> bytes. Decimal units (GB) are powers of 10, binary ones (GiB, and a bare G) of 2."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise UserError(f"{flag} {text!r}: not a memory size; write e.g. 24GiB, 80GB or 32G")
    return int(float(match.group(1)) * _UNITS[unit])


def profile_from_dataset(dataset) -> SequenceProfile:
    """Lengths and supervised-token counts of a ``ChatSFTDataset`` (after truncation and dropping), and with a
    processor, each image's tokens."""
    table = dataset.samples.with_format(None)
    return SequenceProfile.from_samples(table["length"], table["num_supervised"], _image_tokens(dataset, table))


def _image_tokens(dataset, table) -> list[int]:
    """Each image's tokens, from its size in the file's header and the processor's rule (hf_lora_ds.vision.token_count):
    no image is decoded to plan."""
    if (vision := dataset.encoder.vision) is None:
        return []
    count = ImageTokens.of(vision)
    return [count(*image_size(ref, "the training data")) for shown in table["images"] for ref in shown]


def sequence_profile(args: SFTTrainingArguments) -> SequenceProfile:
    """The training data's real lengths, tokenized as training tokenizes them (hf_lora_ds.data.run_data), when the
    model's tokenizer is at hand; else every sample taken as ``max_length`` tokens, all supervised (the bound)."""
    if not args.train_file:
        return SequenceProfile.unknown(args.max_length)
    try:
        tokenizer = load_tokenizer(args, need_weights=False)
        processor = load_run_processor(args)  # a vision-language base: image tokens expanded as training expands them
    except UserError:  # a directory with only config.json, a config file, a hub id out of reach: plan by max_length
        return SequenceProfile.unknown(args.max_length)
    if processor is not None:
        tokenizer = processor.tokenizer
    data = load_run_data(args.train_file, args, args.dataset)
    return profile_from_dataset(sft_dataset(data, tokenizer, args, processor))


def plan_run(
    args: SFTTrainingArguments, plan_args: PlanArguments, profile: SequenceProfile, configs: dict | None = None
) -> list[PlanRow]:
    """Every configuration's row for the run ``args`` describes, on the world ``plan_args`` describes."""
    settings = _plan_settings(args, plan_args, profile)
    configs = configs if configs is not None else shipped_configs()
    for name, config in configs.items():  # unknown stages, batch sizes this world cannot make: refused by key
        if config is not None and not is_fsdp(config):
            check_deepspeed_config(
                config,
                f"ds_configs/{name}",
                micro_batch=args.per_device_train_batch_size,
                accumulation=args.gradient_accumulation_steps,
                world_size=data_parallel_size(settings.world_size, settings.sequence_parallel),
            )
    return make_plan(settings, configs, runtime_bytes(settings.on_accelerator))


def plan_with_more_devices(
    args: SFTTrainingArguments, plan_args: PlanArguments, profile: SequenceProfile, configs: dict
) -> PlanRow | None:
    """For a run nothing fits even split over its world: the smallest sequence-parallel group of devices like the
    planned ones (machines, on a CPU) that would hold it, as that row (plan.planner.fits_with_more_devices)."""
    settings = _plan_settings(args, plan_args, profile)
    return fits_with_more_devices(settings, configs, runtime_bytes(settings.on_accelerator))


def _plan_settings(args: SFTTrainingArguments, plan_args: PlanArguments, profile: SequenceProfile) -> PlanSettings:
    on_accelerator = plans_accelerator(plan_args.device, args)
    world_size, per_node = _world(plan_args, on_accelerator)
    sequence_parallel = args.engine.sequence_parallel
    if world_size % sequence_parallel:
        raise UserError(
            f"--sequence_parallel_size {sequence_parallel} with a world of {world_size}: the "
            "world size must be a multiple of it (--world_size)"
        )
    batching = resolve_batching(args.batching, args.attn_implementation)  # a run's arguments hold it resolved
    settings = PlanSettings(
        model_config=base_model_config(args),
        lora=lora_config_from_args(args),
        dtype=_weights_dtype(args.dtype, on_accelerator),
        batch_size=args.per_device_train_batch_size,
        profile=profile,
        world_size=world_size,
        ranks_per_node=min(per_node, world_size),
        device_memory=_device_memory(args.device_memory, on_accelerator),
        host_memory=_host_memory(plan_args, on_accelerator),
        on_accelerator=on_accelerator,
        headroom=plan_args.headroom,
        attn_implementation=args.attn_implementation,
        quantization="4bit" if args.load_in_4bit else "8bit" if args.load_in_8bit else None,
        padding_free=batching == "padding_free",
        supervised_logits_only=args.supervised_logits_only,
        lora_optimizer=args.lora_optimizer,
        packed_length=args.max_length if batching == "packed" else None,
        sequence_parallel=sequence_parallel,
    )
    if not 0 <= settings.headroom < 1:
        raise UserError(f"--headroom {settings.headroom}: must be in [0, 1)")
    return settings


def _world(plan_args: PlanArguments, on_accelerator: bool) -> tuple[int, int]:
    """World size and ranks per node of the planned run."""
    if plan_args.nproc_per_node:
        per_node = plan_args.nproc_per_node
    elif plan_args.world_size:  # the world asked for, spread evenly over the nodes
        per_node = max(1, plan_args.world_size // plan_args.nnodes)
    else:
        per_node = max(1, torch.accelerator.device_count()) if on_accelerator else 1
    world_size = plan_args.world_size or plan_args.nnodes * per_node
    if world_size < 1 or per_node < 1 or world_size % per_node:
        raise UserError(f"--world_size {world_size} with --nproc_per_node {per_node}: the world must be whole nodes")
    return world_size, per_node


def planning_line(args: SFTTrainingArguments, plan_args: PlanArguments) -> str:
    """What the plan is for, as its first line: ``planning for 2 x GPU with 32 GiB`` or ``planning for this CPU:
    23 GiB host memory, 2 ranks``."""
    on_accelerator = plans_accelerator(plan_args.device, args)
    world_size, _ = _world(plan_args, on_accelerator)
    memory = _device_memory(args.device_memory, on_accelerator) / 2**30
    if on_accelerator:
        return f"planning for {world_size} x GPU with {memory:.0f} GiB"
    return f"planning for this CPU: {memory:.0f} GiB host memory, {world_size} rank{'s' if world_size > 1 else ''}"


def _weights_dtype(dtype: str, on_accelerator: bool) -> torch.dtype:
    """The run's ``--dtype``, ``auto`` resolved as SFTTrainingArguments resolves it on the planned device."""
    return getattr(torch, auto_dtype(on_accelerator) if dtype == "auto" else dtype)


def _host_memory(plan_args: PlanArguments, on_accelerator: bool) -> int | None:
    """``--host_memory``; else this machine's, when the plan is for this machine (planning GPUs from a laptop
    leaves the host unchecked)."""
    if plan_args.host_memory:
        return parse_memory(plan_args.host_memory, "--host_memory")
    if on_accelerator != torch.accelerator.is_available():
        return None
    return psutil.virtual_memory().total


def plans_accelerator(device: str, args: SFTTrainingArguments) -> bool:
    if device != "auto":
        return device == "gpu"
    return torch.accelerator.is_available() and not args.use_cpu


def _device_memory(device_memory: str | None, on_accelerator: bool) -> int:
    if device_memory:
        return parse_memory(device_memory, "--device_memory")
    if on_accelerator and torch.cuda.is_available():  # planning for another GPU kind needs --device_memory
        return torch.cuda.get_device_properties(0).total_memory
    if on_accelerator:
        raise UserError("this accelerator's memory cannot be read: pass --device_memory (e.g. 32GiB)")
    return psutil.virtual_memory().total


def run_world() -> PlanArguments:
    """The world this process was launched into, as the planner's arguments."""
    world_size = launcher_world_size()
    per_node = launcher_ranks_per_node()
    return PlanArguments(world_size=world_size, nproc_per_node=per_node, nnodes=max(1, world_size // per_node))


def config_name(engine: Engine) -> str:
    """A run's DeepSpeed config as a plan row's ``config``: its file's name (so a shipped config is its own row), or
    ``"none"``; a config given as a dict or base64 text is named by its ZeRO setup."""
    if engine.deepspeed_config is None:  # also --deepspeed auto, no configuration of its own: the plan picks one
        return "none"
    if engine.deepspeed_file is not None:
        return engine.deepspeed_file.name
    return f"DeepSpeed {engine.zero.describe()}"


def fsdp_config_name(args: SFTTrainingArguments) -> str:
    """The shipped FSDP2 row an ``--fsdp`` run is planned as: the estimate tells FSDP2 apart only by offload."""
    return "fsdp2_offload.json" if fsdp_settings(args.fsdp_config).get("cpu_offload") else "fsdp2.json"


def configs_with(engine: Engine) -> dict[str, dict | None]:
    """The shipped configurations, plus the run's own DeepSpeed config when it is not one of them."""
    configs = shipped_configs()
    name = config_name(engine)
    if name not in configs:
        configs[name] = engine.deepspeed_config
    return configs


def plan_this_run(args: SFTTrainingArguments, profile: SequenceProfile) -> tuple[PlanRow, list[PlanRow]]:
    """The row of the configuration ``args`` runs (its own DeepSpeed config added when not a shipped one), and
    every row: the alternatives to name when it does not fit."""
    engine = args.engine
    name = fsdp_config_name(args) if engine.kind == "fsdp" else config_name(engine)
    rows = plan_run(args, run_world(), profile, configs_with(engine))
    chosen = next(
        r
        for r in rows
        if r.config == name
        and r.gradient_checkpointing == bool(args.gradient_checkpointing)
        and r.sequence_parallel == engine.sequence_parallel
    )
    return chosen, rows


def recommended_deepspeed_config(args: SFTTrainingArguments) -> Path:
    """``--deepspeed auto``: the first shipped DeepSpeed config that fits, planned before any data is read (every
    sample taken as ``max_length`` tokens, all supervised: the safe bound), at the run's gradient checkpointing."""
    rows = plan_run(args, run_world(), SequenceProfile.unknown(args.max_length))
    deepspeed_rows = [
        r
        for r in rows
        if r.config != "none"
        and not r.config.startswith("fsdp")
        and r.gradient_checkpointing == bool(args.gradient_checkpointing)
    ]
    sequence_parallel = args.engine.sequence_parallel
    candidates = [r for r in deepspeed_rows if r.sequence_parallel == sequence_parallel]
    chosen = recommend(candidates)
    if chosen is None:  # the sequence-parallel size changes the global batch: named, never picked
        smallest = min(candidates, key=lambda r: r.estimate.device_bytes)
        split = recommend([r for r in deepspeed_rows if r.sequence_parallel > sequence_parallel])
        instead = (
            f"With --sequence_parallel_size {split.sequence_parallel}, {plan_line(split)}; or lower"
            if split
            else "Lower"
        )
        raise UserError(
            f"--deepspeed auto: no shipped DeepSpeed config fits; the smallest, {plan_line(smallest)}. {instead} "
            "--per_device_train_batch_size or --max_length, add --gradient_checkpointing true, or use more devices"
        )
    return SHIPPED_CONFIGS_DIR / chosen.config


def check_run_fits(args: SFTTrainingArguments, profile: SequenceProfile) -> PlanRow:
    """run_sft's plan line (rank 0), and on an accelerator a stop before loading when the run will not fit, naming
    the configurations that would (``--check_memory_plan false`` tries anyway). A CPU run only prints: host memory
    swaps rather than failing at a clean boundary, and the planner's CPU figures are what CI checks."""
    chosen, rows = plan_this_run(args, profile)
    logger.info(f"memory plan: {plan_line(chosen)}")
    on_accelerator = plans_accelerator("auto", args)
    if on_accelerator and not chosen.fits and args.check_memory_plan:
        fitting = [plan_line(row) for row in rows if row.fits][:3]
        alternatives = "; ".join(fitting) if fitting else "none of the shipped configurations fits either"
        raise UserError(
            f"the memory plan says this run will not fit: {plan_line(chosen)}. Would fit: {alternatives}. "
            "Lower --per_device_train_batch_size or --max_length, or pass --check_memory_plan false to try anyway"
        )
    return chosen
