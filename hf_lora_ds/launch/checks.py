"""The checks of a run's values that read the file system or a library's list: the paths (shared with the audit,
the planner, the eval and merge commands), --columns/--sharegpt_roles, the LoRA variant, the names --report_to,
--torch_compile_*, --attn_implementation and --eval_task take, and --sequence_parallel_size against the launch and
the model. The value-only checks are hf_lora_ds.config's.
"""

from __future__ import annotations

import os
from pathlib import Path

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.arguments import check_fsdp_config_path
from hf_lora_ds.config.batching import VARLEN_ATTENTION
from hf_lora_ds.config.data import join_sources
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.sources import DATA_SUFFIXES, parse_sources
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.lora_variants import check_lora_variant

__all__ = [
    "check_output_path",
    "check_paths",
    "check_run_values",
    "check_sequence_parallel",
    "check_training_flags",
]


def check_command_line_needs(args: SFTTrainingArguments) -> None:
    """What a command line must name, which code hands the trainer instead (a model, records): the model and the
    training data."""
    if not args.model_name_or_path:
        raise UserError("--model_name_or_path is required: a local model directory or a hub id")
    if not args.train_file:
        raise UserError("--train_file is required: a data file, directory or Hub dataset id of training records")


def check_run_values(args: SFTTrainingArguments) -> None:
    """The checks of the run's values that read a file or ask a library (the value-only ones are
    hf_lora_ds.config's): the paths, the data format mappings, the LoRA variant."""
    check_paths(args)
    FormatOptions.from_flags(args.columns, args.sharegpt_roles)  # a bad mapping fails before the model loads
    check_lora_variant(args)


def check_paths(args: SFTTrainingArguments) -> None:
    """The run's paths, before anything reads or writes them: a local data file of --train_file/--eval_file that is
    missing (mixture weights are parsed here too; directories and Hub ids are checked when read), a file where
    --output_dir or --dataset_cache_dir needs a directory, an --fsdp_config that is no file. ``args`` built or
    ``unbuilt``."""
    join_sources(args)  # a YAML list of sources: the same as the comma-separated flag
    for flag in ("train_file", "eval_file"):
        spec = getattr(args, flag)
        for source in parse_sources(spec) if spec else []:
            if source.location.lower().endswith(DATA_SUFFIXES) and not os.path.isfile(source.location):
                raise MissingPathError(f"--{flag} {source.location}: no such file")
    for flag in ("output_dir", "dataset_cache_dir"):
        check_output_path(f"--{flag}", getattr(args, flag))
    check_fsdp_config_path(args)


def check_output_path(flag: str, value: str | os.PathLike | None, *, file: bool = False) -> None:
    """Raise a ``UserError`` when ``value``, a directory to be created or written (``file``: a file to be written,
    whose folders are), is blocked by a file: makedirs would fail with a traceback only once there is something to
    write."""
    if value and (blocker := _file_in_the_way(Path(value).parent if file else Path(value))):
        raise UserError(f"{flag} {value}: {blocker} is a file, not a directory; choose another path")


def check_sequence_parallel(args: SFTTrainingArguments, world_size: int) -> None:
    """``--sequence_parallel_size N`` against the launch and the model (the flags alone are checked by
    hf_lora_ds.config.engine): the world a multiple of N, and heads N can split. ``world_size`` is the launcher's."""
    size = args.sequence_parallel_size
    if size == 1:
        return
    if world_size % size:
        raise UserError(
            f"--sequence_parallel_size {size} with {world_size} rank(s): the world size must be a "
            f"multiple of {size} (each group of {size} ranks trains one batch); launch {size} or "
            f"{2 * size} ranks"
        )
    if args.model_name_or_path:  # a model handed to the trainer in code is checked by its own config once loaded
        _check_heads(args, size)


def _check_heads(args: SFTTrainingArguments, size: int) -> None:
    """Ulysses gives each rank 1/N of the query heads, and of the key/value heads (or replicates them when there
    are fewer than N): the config alone says whether that divides."""
    from hf_lora_ds.model.loading import base_model_config

    config = base_model_config(args).get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % size or (kv_heads % size and size % kv_heads):
        raise UserError(
            f"--sequence_parallel_size {size}: {args.model_name_or_path} has {heads} attention heads "
            f"({kv_heads} key/value heads); Ulysses splits heads over the ranks, so N must divide the "
            f"heads and divide or be divided by the key/value heads: use {_head_divisors(heads, kv_heads)}"
        )


def _head_divisors(heads: int, kv_heads: int) -> str:
    sizes = [n for n in range(2, heads + 1) if heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)]
    return "one of " + ", ".join(map(str, sizes[:6])) if sizes else "no sequence parallelism for this model"


def check_training_flags(args: SFTTrainingArguments) -> None:
    """The names above (the dict-valued flags, which TrainingArguments reads when built, are hf_lora_ds.config's)."""
    _check_names(args)


def _check_names(args: SFTTrainingArguments) -> None:
    """Names checked against the libraries' own lists, before a model is loaded rather than when it is used."""
    from accelerate.utils import DynamoBackend
    from torch._inductor import list_mode_options
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hf_lora_ds.eval import available_tasks

    reporters = args.report_to if isinstance(args.report_to, list) else [args.report_to]
    _one_of("report_to", [r for r in reporters if r not in ("all", "none")], list(INTEGRATION_TO_CALLBACK))
    _one_of(
        "torch_compile_backend",
        [args.torch_compile_backend.lower()] if args.torch_compile_backend else [],
        [backend.value.lower() for backend in DynamoBackend],
    )
    _one_of(
        "torch_compile_mode", [args.torch_compile_mode] if args.torch_compile_mode else [], list(list_mode_options())
    )
    attention = args.attn_implementation
    if attention and "/" not in attention:  # "org/repo" is a Hub attention kernel
        kernels = [name for name in ALL_ATTENTION_FUNCTIONS.valid_keys() if not name.startswith("hf_lora_ds")]
        # not the planner's stand-in; varlen_attn is registered when its model loads (hf_lora_ds.model.varlen_attention)
        _one_of("attn_implementation", [attention], ["eager", VARLEN_ATTENTION, *kernels])
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
