"""``SFTTrainingArguments``: TrainingArguments plus the model, quantization, data, LoRA, vision, engine, memory plan,
reliability and reporting fields of a LoRA SFT run, one flat dataclass composed from the parts beside it.

``__post_init__`` checks the values alone (no file, environment variable or process group is read: the checks of
the run around them are hf_lora_ds.launch.resolve's, which ``LoraSFTTrainer`` runs on arguments not ``resolved`` yet),
then resolves what TrainingArguments needs first: ``--dtype auto`` and the mixed precision that goes with it, and a
shipped DeepSpeed config's short name. A refusal names a field as it was given (hf_lora_ds.config.naming).
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

import torch
from transformers import TrainingArguments

from hf_lora_ds._compat import deepspeed_startup_trimmed
from hf_lora_ds.config.batching import Batching, resolve_batching
from hf_lora_ds.config.data import DataArguments, check_data_fields, join_sources
from hf_lora_ds.config.deepspeed import deepspeed_config_path
from hf_lora_ds.config.engine import Engine, EngineArguments, check_engine_fields, engine_of, parallelism_config
from hf_lora_ds.config.lora import LoraArguments, check_lora_fields
from hf_lora_ds.config.lora_init import LoraInit, parse_lora_init
from hf_lora_ds.config.memory_plan import MemoryPlanArguments
from hf_lora_ds.config.model import ModelArguments, check_model_fields
from hf_lora_ds.config.naming import named_as_given
from hf_lora_ds.config.quantization import QuantizationArguments, check_quantization_fields
from hf_lora_ds.config.ranges import check_ranges
from hf_lora_ds.config.reliability import ReliabilityArguments, resolve_nan_inf_filter
from hf_lora_ds.config.reporting import ReportingArguments, check_reporting_fields
from hf_lora_ds.config.vision import VisionArguments, check_vision_fields
from hf_lora_ds.devices import auto_dtype, available_accelerator
from hf_lora_ds.errors import MissingPathError, UserError

__all__ = [
    "SFTTrainingArguments",
    "check_dict_fields",
    "check_field_values",
    "check_fsdp_config_path",
    "pinned_memory_helps",
]


@dataclass
class SFTTrainingArguments(
    ModelArguments,
    QuantizationArguments,
    DataArguments,
    LoraArguments,
    VisionArguments,
    EngineArguments,
    MemoryPlanArguments,
    ReliabilityArguments,
    ReportingArguments,
    TrainingArguments,
):
    # Decided from the fields once, where they are (``__post_init__``, ``unbuilt``), and read by the rest of the package
    # instead of the flags they are decided from: neither flags nor saved with the arguments.
    engine: Engine = field(default=Engine(), init=False, repr=False)  # hf_lora_ds.config.engine
    lora_start: LoraInit = field(default=parse_lora_init("default"), init=False, repr=False)  # --lora_init
    # --batching as given: ``batching`` holds it resolved, and auto is resolved again once the model's layers are known
    # (hf_lora_ds.training.batches).
    batching_asked: Batching = field(default="auto", init=False, repr=False)
    # Set once the run's checks have passed (hf_lora_ds.launch.resolve).
    resolved: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        """The checks of the fields, alone and together, before TrainingArguments builds anything from them; then the
        values TrainingArguments needs resolved first."""
        with named_as_given(self):
            check_field_values(self)
            self._resolve_precision()
            if isinstance(self.deepspeed, str):  # transformers reads a file or base64 text, not a short name
                self.deepspeed = deepspeed_config_path(self.deepspeed)
            self.lora_start = parse_lora_init(self.lora_init)
            resolve_nan_inf_filter(self)
        self.batching_asked = self.batching
        self.batching = resolve_batching(self.batching, self.attn_implementation)  # what the planner and trainer read
        if self.sequence_parallel_size > 1:  # the kernel is pinned again once the model is loaded (LoraSFTTrainer)
            self.parallelism_config = parallelism_config(
                self.sequence_parallel_size, self.attn_implementation or "sdpa"
            )
        if not pinned_memory_helps(self.use_cpu):
            self.dataloader_pin_memory = False  # else every DataLoader warns that pinning did nothing
        non_blocking_asked = _non_blocking_given(self.accelerator_config)
        # accelerate initialises deepspeed.comm here on its accelerator path: as the run makes it (hf_lora_ds._compat)
        with deepspeed_startup_trimmed() if self.deepspeed else nullcontext():
            super().__post_init__()
        if self.dataloader_pin_memory and not non_blocking_asked:
            # A blocking copy to the device synchronises its stream: the host would wait for the last step's kernels
            # at every batch tensor instead of queueing the next step's.
            self.accelerator_config.non_blocking = True
        self.engine = engine_of(self)  # with DeepSpeed's config as TrainingArguments filled it in

    @classmethod
    def unbuilt(cls, **values: Any) -> SFTTrainingArguments:
        """The arguments with ``values`` (the fields' defaults for the rest), decided (``engine``, ``lora_start``) and
        neither checked nor built: TrainingArguments' ``__post_init__`` sets the launch up (the process group,
        DeepSpeed's config). What a command line is resolved on before its run is built (hf_lora_ds.launch.resolve),
        and what the audit and the planner read, which build no run; ``built()`` makes the run's arguments of it."""
        unknown = sorted(set(values) - {f.name for f in fields(cls) if f.init})
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {unknown}")
        args = cls.__new__(cls)
        for f in fields(cls):
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            setattr(args, f.name, values.get(f.name, default) if f.init else default)
        args.engine = engine_of(args)
        args.lora_start = parse_lora_init(args.lora_init)
        args.batching_asked = args.batching
        return args

    def built(self) -> SFTTrainingArguments:
        """Arguments of the same field values, checked and built (``__post_init__``); ``self`` is left as it is."""
        return replace(self)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def _resolve_precision(self) -> None:
        """Weights dtype and mixed precision must agree, or DeepSpeed and autocast disagree about every tensor."""
        if self.dtype == "auto":
            self.dtype = auto_dtype(on_accelerator=torch.cuda.is_available() and not self.use_cpu, fp16=self.fp16)
        check_model_fields(self)
        if self.dtype == "bfloat16":
            self.bf16 = True
        elif self.dtype == "float16":
            self.fp16 = True


def check_field_values(args: SFTTrainingArguments) -> None:
    """Every check that needs the field values only, part by part; ``args`` built or not (``unbuilt``: the audit and
    the planner build none)."""
    join_sources(args)
    check_ranges(args)
    check_model_fields(args)
    check_quantization_fields(args)
    check_data_fields(args)
    check_lora_fields(args)
    check_vision_fields(args)
    check_engine_fields(args)
    check_reporting_fields(args)
    check_dict_fields(args)


def check_dict_fields(args: SFTTrainingArguments) -> None:
    """The dict-valued fields, which TrainingArguments reads when built: a value starting with '{' as JSON (its error
    names no field), any other as a file path (--accelerator_config's only once the Trainer is built). --deepspeed
    has its own checks (hf_lora_ds.launch.resolve)."""
    check_fsdp_config_path(args)
    for flag in SFTTrainingArguments._VALID_DICT_FIELDS:
        value = getattr(args, flag)
        if flag == "deepspeed" or not isinstance(value, str) or not value:
            continue
        if value.lstrip().startswith("{"):
            try:
                json.loads(value)
            except json.JSONDecodeError as err:
                raise UserError(f"--{flag} {value!r}: not valid JSON ({err.msg} at column {err.colno})") from None
        elif not os.path.isfile(value):
            raise MissingPathError(f"--{flag} {value}: no such file; pass a JSON file or an inline JSON object")


def check_fsdp_config_path(args: SFTTrainingArguments) -> None:
    """An --fsdp_config that is no file, named with the shipped one."""
    if args.fsdp and isinstance(args.fsdp_config, str) and not os.path.isfile(args.fsdp_config):
        raise MissingPathError(f"--fsdp_config {args.fsdp_config}: no such file (e.g. fsdp_configs/fsdp2.json)")


def _non_blocking_given(accelerator_config: Any) -> bool:
    """Whether ``--accelerator_config`` sets ``non_blocking``: a dict with the key, or a config file, read as it is."""
    if isinstance(accelerator_config, dict):
        return "non_blocking" in accelerator_config
    return accelerator_config is not None


def pinned_memory_helps(use_cpu: bool) -> bool:
    """Pinned host memory only speeds copies to an accelerator: with none (or ``--use_cpu``) it does nothing."""
    return not use_cpu and available_accelerator() is not None
