"""Integrity check for saved LoRA adapters: refuse an adapter that cannot be used, at the moment it is saved.

Under ZeRO-3 every rank holds only a shard of each parameter; an adapter saved without gathering them (no
``stage3_gather_16bit_weights_on_model_save``, or ``save_pretrained`` on the engine's module) holds tensors of
shape ``[0]``. Nothing fails until someone merges or reloads it, often days later. Checking the file right after the
save turns that into an immediate error that says what to change.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.utils import load_peft_weights
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, PretrainedConfig
from transformers.modeling_utils import set_zero3_state

from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.experts import unwrapped_name
from hf_lora_ds.model.lora import shape_config
from hf_lora_ds.model.lora_targets import peft_keeps_exact_targets
from hf_lora_ds.vision.modules import vision_model_class

__all__ = [
    "AdapterIntegrityError",
    "UntrainedAdapterError",
    "check_adapter_directory",
    "check_adapter_trained",
    "verify_adapter",
]

_EMPTY_HINT = (
    "Under DeepSpeed ZeRO-3 the adapter must be saved with the partitioned weights gathered: set "
    '"stage3_gather_16bit_weights_on_model_save": true in the DeepSpeed config and save through '
    "Trainer.save_model (not model.save_pretrained on a rank's shard)."
)


# lora_A / lora_embedding_A are (r, in); lora_B / lora_embedding_B are (out, r). Embedding factors have no ".weight".
_LORA_KEY = re.compile(r"^(.*)\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B)(?:\.|$)")


class AdapterIntegrityError(UserError):
    """A saved adapter is unusable: empty tensors, wrong shapes, or it does not load on its base model."""


class UntrainedAdapterError(AdapterIntegrityError):
    """Optimizer steps ran at a non-zero learning rate, yet every ``lora_B`` is still exactly zero."""


def check_adapter_directory(path: str | os.PathLike, flag: str = "--adapter") -> None:
    """Raise a one-line ``UserError`` naming ``flag`` unless ``path`` is a directory holding ``adapter_config.json``,
    before any model is loaded (PEFT's own ``from_pretrained`` says "Can't find 'adapter_config.json'" with a
    traceback, and treats a path it cannot find as a Hub id)."""
    path = Path(path)
    if not path.exists():
        raise MissingPathError(
            f"{flag} {path}: no such directory; pass the directory a run saved its adapter to "
            "(its --output_dir, or a checkpoint-N in it)"
        )
    if not path.is_dir():
        raise UserError(
            f"{flag} {path}: is a file, not an adapter directory; pass the directory that holds adapter_config.json"
        )
    if not (path / "adapter_config.json").is_file():
        raise UserError(
            f"{flag} {path}: the directory has no adapter_config.json, so it is not a saved PEFT adapter; "
            "pass a run's --output_dir or a checkpoint-N in it"
        )


def check_adapter_trained(adapter_dir: str | os.PathLike, steps: int, max_learning_rate: float) -> None:
    """Raise ``UntrainedAdapterError`` when a saved adapter never moved from LoRA's initial state.

    LoRA starts every B matrix at zero, so the adapter adds nothing until an optimizer step changes B. After steps
    at a learning rate above zero, a B still exactly zero everywhere means no gradient reached the LoRA weights (a
    frozen adapter, a detached loss, parameters missing from the optimizer): the file is valid and loads, and the
    run would look fine until someone notices the model did not change. Steps taken only at a learning rate of zero
    (the first step of a warmup, say) cannot move B, so they prove nothing and pass. Initialisations that do not
    start B at zero (``init_lora_weights=False``, PiSSA) cannot be judged this way and pass too.
    """
    if steps == 0 or max_learning_rate <= 0:
        return
    weights = _load_weights(Path(adapter_dir))
    b_factors = [t for name, t in weights.items() if (m := _LORA_KEY.match(name)) and m.group(2).endswith("B")]
    if b_factors and not any(tensor.any() for tensor in b_factors):
        raise UntrainedAdapterError(
            f"The adapter saved in {adapter_dir} never trained: all {len(b_factors)} lora_B tensors are still exactly "
            f"zero (LoRA's initial value) after {steps} optimizer steps at a learning rate up to "
            f"{max_learning_rate:g}, so it changes nothing. No gradient reached the LoRA weights: check that they "
            "require grad and are in the optimizer, and that the loss is computed from the model's output."
        )


def verify_adapter(
    adapter_dir: str | os.PathLike, base_model: str | os.PathLike | PretrainedConfig | None = None
) -> None:
    """Raise ``AdapterIntegrityError`` unless ``adapter_dir`` holds a complete, loadable LoRA adapter.

        Always checked: ``adapter_config.json`` parses, there are weights, none is empty or non-finite, and each
        module's ``lora_A``/``lora_B`` ranks agree with the config. With ``base_model`` (a local model directory, or the
    base's config when the model is at hand), also:
        every tensor has exactly the shape the base's modules imply (r, in/out features) and
        ``PeftModel.from_pretrained`` loads it. The base is instantiated on the meta device, so the check costs no
        memory for the base weights even for large models.
    """
    adapter_dir = Path(adapter_dir)
    config = _load_config(adapter_dir)
    weights = _load_weights(adapter_dir)
    _check_values(adapter_dir, weights)
    _check_ranks(adapter_dir, config, weights)
    if base_model is not None:
        if isinstance(base_model, PretrainedConfig):
            _check_against_base(adapter_dir, config, weights, base_model, base_model.name_or_path or "the base model")
        else:
            _check_against_base(adapter_dir, config, weights, AutoConfig.from_pretrained(str(base_model)), base_model)


def _load_config(adapter_dir: Path) -> LoraConfig:
    config_file = adapter_dir / "adapter_config.json"
    if not config_file.is_file():
        raise AdapterIntegrityError(f"{config_file} is missing: {adapter_dir} is not a saved PEFT adapter.")
    try:
        config = PeftConfig.from_pretrained(str(adapter_dir))
    except (ValueError, TypeError, json.JSONDecodeError) as error:
        raise AdapterIntegrityError(f"{config_file} does not parse as a PEFT config: {error}") from error
    if not isinstance(config, LoraConfig):
        raise AdapterIntegrityError(f"{config_file} is a {type(config).__name__}; only LoRA adapters are checked.")
    return config


def _load_weights(adapter_dir: Path) -> dict[str, torch.Tensor]:
    try:
        weights = load_peft_weights(str(adapter_dir), device="cpu")
    except (OSError, ValueError, RuntimeError) as error:
        raise AdapterIntegrityError(f"No readable adapter weights in {adapter_dir}: {error}") from error
    if not weights:
        raise AdapterIntegrityError(f"The adapter weights in {adapter_dir} hold no tensors. {_EMPTY_HINT}")
    return weights


def _check_values(adapter_dir: Path, weights: dict[str, torch.Tensor]) -> None:
    empty = sorted(name for name, tensor in weights.items() if tensor.numel() == 0)
    if empty:
        raise AdapterIntegrityError(
            f"{len(empty)} of {len(weights)} tensors in {adapter_dir} are empty (numel 0), e.g. {empty[:3]} with "
            f"shape {tuple(weights[empty[0]].shape)}. {_EMPTY_HINT}"
        )
    non_finite = sorted(name for name, tensor in weights.items() if not torch.isfinite(tensor.float()).all())
    if non_finite:
        raise AdapterIntegrityError(
            f"{len(non_finite)} tensors in {adapter_dir} hold NaN/inf, e.g. {non_finite[:3]}: training diverged; "
            "lower the learning rate or check the loss scale (fp16)."
        )


def _check_ranks(adapter_dir: Path, config: LoraConfig, weights: dict[str, torch.Tensor]) -> None:
    """Without the base, the config still fixes each module's rank: lora_A is (r, in), lora_B is (out, r); a fused
    expert weight's adapter (PEFT's ``target_parameters``) stacks one rank-r adapter per expert: r x experts."""
    allowed_ranks = {config.r, *(config.rank_pattern or {}).values()}
    expert_modules = {name.rsplit(".", 1)[0] for name in config.target_parameters or []}
    ranks: dict[str, dict[str, int]] = {}
    for name, tensor in weights.items():
        match = _LORA_KEY.match(name)
        if match and tensor.dim() == 2:
            module, part = match.group(1), match.group(2)
            ranks.setdefault(module, {})[part] = tensor.shape[0 if part.endswith("A") else 1]
    if not ranks:
        raise AdapterIntegrityError(f"{adapter_dir} holds no lora_A/lora_B tensors; is it a LoRA adapter?")
    for module, found in sorted(ranks.items()):
        rank = next(iter(found.values()))
        stacked = unwrapped_name(module) in expert_modules  # (r x experts): the count of experts is the base's
        fits = any(rank % allowed == 0 for allowed in allowed_ranks) if stacked else rank in allowed_ranks
        if len(set(found.values())) != 1 or not fits:
            raise AdapterIntegrityError(
                f"{adapter_dir}: module {module} has ranks {found}, but adapter_config.json allows r in "
                f"{sorted(allowed_ranks)}. The weights and the config come from different runs; save them together."
            )


def _check_against_base(
    adapter_dir: Path,
    config: LoraConfig,
    weights: dict[str, torch.Tensor],
    base_config: PretrainedConfig,
    base_model: str | os.PathLike,
) -> None:
    if _base_class(base_config) is None:
        raise AdapterIntegrityError(
            f"Cannot rebuild base {base_model} ({type(base_config).__name__}) without running its remote code; "
            "verify this adapter with base_model=None (file checks only) or load it by hand."
        )
    try:
        expected = _expected_shapes(base_config, config)
    except ValueError as error:  # peft: target modules not found in the base, and similar
        raise AdapterIntegrityError(f"Adapter {adapter_dir} does not apply to base {base_model}: {error}") from error
    saved = {name: tuple(tensor.shape) for name, tensor in weights.items()}
    missing = sorted(expected.keys() - saved.keys())
    # Extra non-LoRA tensors (resized embeddings, modules_to_save) are checked by from_pretrained below.
    unexpected = sorted(name for name in saved.keys() - expected.keys() if ".lora_" in name)
    wrong = sorted(name for name in expected.keys() & saved.keys() if expected[name] != saved[name])
    if missing or unexpected or wrong:
        details = [f"missing {missing[:3]}"] * bool(missing) + [f"unexpected {unexpected[:3]}"] * bool(unexpected)
        details += [f"{name}: saved {saved[name]}, base {base_model} implies {expected[name]}" for name in wrong[:3]]
        raise AdapterIntegrityError(
            f"Adapter {adapter_dir} does not fit base {base_model}: {'; '.join(details)}. Pass the base model the "
            "adapter was trained on, and save config and weights together."
        )
    try:
        with peft_keeps_exact_targets():
            PeftModel.from_pretrained(
                _meta_base(base_config), str(adapter_dir), config=shape_config(config), low_cpu_mem_usage=True
            )
    except Exception as error:  # any failure here means users cannot load the adapter either
        raise AdapterIntegrityError(
            f"PeftModel.from_pretrained failed for adapter {adapter_dir} on base {base_model}: {error}"
        ) from error


def _expected_shapes(base_config, config: LoraConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of the LoRA tensors peft creates for ``config`` on this base, computed on the meta device."""
    with peft_keeps_exact_targets():  # no SVD or data pass of a weightless base
        model = get_peft_model(_meta_base(base_config), shape_config(config))
    state = get_peft_model_state_dict(model, save_embedding_layers=False)
    return {name: tuple(tensor.shape) for name, tensor in state.items()}


def _meta_base(base_config) -> torch.nn.Module:
    """Weightless base. The class is called directly: ``from_config`` would enter ``deepspeed.zero.Init`` during a
    ZeRO-3 run, a collective that hangs when only rank 0 verifies. ``set_zero3_state`` keeps the sub-models a class
    builds with ``_from_config`` itself (a vision-language model's tower and language model) out of it too."""
    with set_zero3_state(), torch.device("meta"):
        return _base_class(base_config)(base_config)


def _base_class(base_config) -> type | None:
    """The class the base loads as: a vision-language model's with its tower, else its causal LM's (None: neither
    is known to transformers, so only its remote code could build it)."""
    return vision_model_class(base_config) or MODEL_FOR_CAUSAL_LM_MAPPING.get(type(base_config), None)
