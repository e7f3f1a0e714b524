"""Checks of the flags transformers takes as they are and fails on later, with a traceback that names no flag.

Numeric ranges first.
Out of range, these either end deep in a run with a library traceback that names no flag (``--learning_rate -3``:
torch's "Invalid learning rate", ``--seed -3``: numpy's "Seed must be between 0 and 2**32 - 1",
``--per_device_train_batch_size -3``: the DataLoader's) or are accepted and silently do something else
(``--gradient_accumulation_steps -3`` and ``--max_steps -3`` train as if unset). Found by the argument sweep in
tests/test_cli_sweep.py; checked before any model is loaded. Then the flags whose bad values the sweep found
failing later: JSON-valued flags, config files, --report_to, --torch_compile_backend/_mode,
--attn_implementation, --eval_task. And the paths (``check_paths``, shared with the audit, the planner, the eval
and merge commands): a missing data file, a file where --output_dir or --dataset_cache_dir needs a directory. Last,
--sequence_parallel_size against the launch, the attention kernel, the batching and the model's heads.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_lora_ds.config.batching import is_flash_attention
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.sources import DATA_SUFFIXES, parse_sources
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.lora_variants import check_lora_variant

__all__ = [
    "RANGES",
    "check_fields",
    "check_lora",
    "check_model_and_data",
    "check_output_path",
    "check_paths",
    "check_ranges",
    "check_sequence_parallel",
    "check_training_flags",
]

_SEED_MAX = 2**32 - 1


def _at_least(low: float) -> tuple[Callable[[float], bool], str]:
    return (lambda value: value >= low), f"at least {low:g}"


_POSITIVE = ((lambda value: value > 0), "positive")
_UNIT = ((lambda value: 0 <= value < 1), "in [0, 1)")
_SEED = ((lambda value: 0 <= value <= _SEED_MAX), f"in [0, {_SEED_MAX}]")


# flag -> (holds, what the flag must be); None (unset) always passes.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "per_device_train_batch_size": _at_least(1),
    "per_device_eval_batch_size": _at_least(1),
    "gradient_accumulation_steps": _at_least(1),
    "eval_accumulation_steps": _at_least(1),
    "num_train_epochs": _POSITIVE,
    "max_steps": ((lambda value: value == -1 or value >= 1), "-1 (train for --num_train_epochs) or at least 1"),
    "learning_rate": _at_least(0),
    "weight_decay": _at_least(0),
    "adam_beta1": _UNIT,
    "adam_beta2": _UNIT,
    "adam_epsilon": _at_least(0),
    "max_grad_norm": _at_least(0),
    "label_smoothing_factor": _UNIT,
    "neftune_noise_alpha": _POSITIVE,
    "logging_steps": _POSITIVE,
    "eval_steps": _POSITIVE,
    "save_steps": _POSITIVE,
    "eval_delay": _at_least(0),
    "save_total_limit": _at_least(1),
    "seed": _SEED,
    "data_seed": _SEED,
    "dataloader_num_workers": _at_least(0),
    "ddp_bucket_cap_mb": _at_least(1),
    "ddp_timeout": _at_least(1),
}


def check_ranges(args: Any) -> None:
    """Raise a ``UserError`` naming the first flag whose value is out of its range (or not a finite number)."""
    for name, (holds, wanted) in RANGES.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if not math.isfinite(value) or not holds(value):
            raise UserError(f"--{name} must be {wanted}, got {value}")


def check_fields(args: Any) -> None:
    """Every check of a single field or of fields against each other that needs neither the launch nor a model:
    ``SFTTrainingArguments`` runs it first."""
    check_ranges(args)
    check_model_and_data(args)
    check_lora(args)


def check_model_and_data(args: Any) -> None:
    """A model and training data named, local data files present, the data and batching flags consistent."""
    if not args.model_name_or_path:
        raise UserError("--model_name_or_path is required: a local model directory or a hub id")
    if not args.train_file:
        raise UserError("--train_file is required: a data file, directory or Hub dataset id of training records")
    check_paths(args)
    FormatOptions.from_flags(args.columns, args.sharegpt_roles)  # a bad mapping fails before the model loads
    if args.preprocessing_num_workers is not None and args.preprocessing_num_workers < 1:
        raise UserError(f"--preprocessing_num_workers must be a positive integer, got {args.preprocessing_num_workers}")
    if args.max_length < 2:
        raise UserError(f"--max_length must be at least 2 tokens, got {args.max_length}")
    if args.batching == "padding_free" and args.pad_to_multiple_of:
        raise UserError("--pad_to_multiple_of has no effect with --batching padding_free; drop one of them")
    if args.batching in ("padding_free", "packed") and args.use_cache:
        # transformers only detects packed sequences when no KV cache is built; with one, samples attend to each other.
        raise UserError(f"--batching {args.batching} needs --use_cache False (a KV cache hides the sequence boundaries)")
    if args.pad_to_multiple_of is not None and args.pad_to_multiple_of < 1:
        raise UserError(f"--pad_to_multiple_of must be a positive integer, got {args.pad_to_multiple_of}")


def check_lora(args: Any) -> None:
    """LoRA's numbers in range, some target named and the variant possible, before PEFT fails on them with a
    traceback (or, for a variant, trains something else than asked: hf_lora_ds.model.lora_variants)."""
    if args.lora_rank < 1:
        raise UserError(f"--lora_rank must be a positive integer, got {args.lora_rank}")
    if args.lora_alpha <= 0:
        raise UserError(f"--lora_alpha must be positive, got {args.lora_alpha}")
    if not 0 <= args.lora_dropout < 1:
        raise UserError(f"--lora_dropout must be in [0, 1), got {args.lora_dropout}")
    if not args.lora_target_modules.strip(" ,"):
        raise UserError("--lora_target_modules is empty; use 'all-linear' or names such as 'q_proj,v_proj'")
    check_lora_variant(args)


def check_paths(args: Any) -> None:
    """The run's paths, before anything reads or writes them: a local data file of --train_file/--eval_file that is
    missing (mixture weights are parsed here too; directories and Hub ids are checked when read), a file where
    --output_dir or --dataset_cache_dir needs a directory, an --fsdp_config that is no file. ``args`` holds run_sft's
    fields (parsed values or the arguments object)."""
    for flag in ("train_file", "eval_file"):
        spec = getattr(args, flag)
        if isinstance(spec, list):  # a YAML list of sources: the same as the comma-separated flag
            setattr(args, flag, spec := ",".join(_source_text(entry) for entry in spec))
        for source in parse_sources(spec) if spec else []:
            if source.location.lower().endswith(DATA_SUFFIXES) and not os.path.isfile(source.location):
                raise MissingPathError(f"--{flag} {source.location}: no such file")
    for flag in ("output_dir", "dataset_cache_dir"):
        check_output_path(f"--{flag}", getattr(args, flag))
    if args.fsdp and isinstance(args.fsdp_config, str) and not os.path.isfile(args.fsdp_config):
        raise MissingPathError(f"--fsdp_config {args.fsdp_config}: no such file (e.g. fsdp_configs/fsdp2.json)")


def check_output_path(flag: str, value: str | os.PathLike | None, *, file: bool = False) -> None:
    """Raise a ``UserError`` when ``value``, a directory to be created or written (``file``: a file to be written,
    whose folders are), is blocked by a file: makedirs would fail with a traceback only once there is something to
    write."""
    if value and (blocker := _file_in_the_way(Path(value).parent if file else Path(value))):
        raise UserError(f"{flag} {value}: {blocker} is a file, not a directory; choose another path")


def check_sequence_parallel(args: Any, world_size: int) -> None:
    """``--sequence_parallel_size N``: each condition Ulysses needs, one line each, before any model is loaded
    (DeepSpeed's own checks come after loading, with a traceback). ``world_size`` is the launcher's."""
    size = args.sequence_parallel_size
    if size < 1:
        raise UserError(f"--sequence_parallel_size must be a positive integer, got {size}")
    if size == 1:
        return
    flag = f"--sequence_parallel_size {size}"
    if not args.deepspeed:
        raise UserError(f"{flag} needs DeepSpeed (Ulysses is DeepSpeed's sequence parallelism): add --deepspeed stage2 "
                        "(or stage1, stage3), or launch with an accelerate DeepSpeed config")  # fmt: skip
    if world_size % size:
        raise UserError(f"{flag} with {world_size} rank(s): the world size must be a multiple of {size} (each group of "
                        f"{size} ranks trains one batch); launch {size} or {2 * size} ranks")  # fmt: skip
    attention = args.attn_implementation or "sdpa"
    if attention in ("eager", "flex_attention") or attention.startswith("paged"):
        raise UserError(f"--attn_implementation {attention} with {flag}: Ulysses discards the attention mask this kernel "
                        "needs; use sdpa (the default) or flash_attention_2")  # fmt: skip
    if args.batching in ("packed", "padding_free") and not is_flash_attention(attention):
        # UlyssesSPAttentionHF drops the block-diagonal mask transformers builds from restarting position_ids and runs
        # sdpa as plain causal over the gathered sequence; only flash's varlen path reads the boundaries itself.
        raise UserError(f"--batching {args.batching} with {flag} and {attention} attention: Ulysses drops the mask that "
                        "keeps packed samples apart, so they would attend to each other; use --batching padded, or "
                        "--attn_implementation flash_attention_2 on a GPU")  # fmt: skip
    _check_heads(args, size)


def _check_heads(args: Any, size: int) -> None:
    """Ulysses gives each rank 1/N of the query heads, and of the key/value heads (or replicates them when there
    are fewer than N): the config alone says whether that divides."""
    from hf_lora_ds.model.loading import base_model_config

    config = base_model_config(args).get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % size or (kv_heads % size and size % kv_heads):
        raise UserError(f"--sequence_parallel_size {size}: {args.model_name_or_path} has {heads} attention heads "
                        f"({kv_heads} key/value heads); Ulysses splits heads over the ranks, so N must divide the "
                        f"heads and divide or be divided by the key/value heads: use {_head_divisors(heads, kv_heads)}")  # fmt: skip


def _head_divisors(heads: int, kv_heads: int) -> str:
    sizes = [n for n in range(2, heads + 1) if heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)]
    return "one of " + ", ".join(map(str, sizes[:6])) if sizes else "no sequence parallelism for this model"


def _source_text(entry: str | dict) -> str:
    """One YAML source entry (``"a.jsonl:0.7"`` or ``{path: a.jsonl, weight: 0.7}``) as flag text."""
    if isinstance(entry, dict):
        return f"{entry.get('path', '')}:{entry['weight']}" if "weight" in entry else str(entry.get("path", ""))
    return str(entry)


def check_training_flags(args: Any) -> None:
    """The non-numeric flags above, in the order a user would fix them; ``args`` is an SFTTrainingArguments."""
    _check_dict_flags(args)
    _check_names(args)


def _check_dict_flags(args: Any) -> None:
    """transformers reads a value starting with '{' as JSON (its error names no flag) and any other as a file path,
    which --accelerator_config opens only when the Trainer is built. --deepspeed has its own checks."""
    for flag in args._VALID_DICT_FIELDS:
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


def _check_names(args: Any) -> None:
    """Names checked against the libraries' own lists, before a model is loaded rather than when it is used."""
    from accelerate.utils import DynamoBackend
    from torch._inductor import list_mode_options
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hf_lora_ds.eval import available_tasks

    reporters = args.report_to if isinstance(args.report_to, list) else [args.report_to]
    _one_of("report_to", [r for r in reporters if r not in ("all", "none")], list(INTEGRATION_TO_CALLBACK))
    _one_of("torch_compile_backend", [args.torch_compile_backend.lower()] if args.torch_compile_backend else [],
            [backend.value.lower() for backend in DynamoBackend])  # fmt: skip
    _one_of("torch_compile_mode", [args.torch_compile_mode] if args.torch_compile_mode else [], list(list_mode_options()))
    attention = args.attn_implementation
    if attention and "/" not in attention:  # "org/repo" is a Hub attention kernel
        kernels = [name for name in ALL_ATTENTION_FUNCTIONS.valid_keys() if not name.startswith("hf_lora_ds")]
        _one_of("attn_implementation", [attention], ["eager", *kernels])  # not the planner's stand-in
    _one_of("eval_task", [args.eval_task], available_tasks())


def _one_of(flag: str, values: list[str], known: list[str]) -> None:
    for value in values:
        if value not in known:
            raise UserError(f"--{flag} {value}: unknown; use one of {sorted(known)}")


def _file_in_the_way(path: Path) -> Path | None:
    """The path itself or the first of its parents that exists as something other than a directory (makedirs would
    raise FileExistsError or NotADirectoryError with a traceback)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None
