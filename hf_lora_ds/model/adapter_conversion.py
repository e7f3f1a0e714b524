"""The adapter at its start, and the saved adapter made plain LoRA for the original base.

PiSSA, OLoRA and CorDA split each adapted weight W into the adapter's start s·B0·A0 and a residual the base keeps,
W_res = W - s·B0·A0 (s: LoRA's scaling). After training the model is W_res + s·B·A = W + s·(B·A - B0·A0), and
B·A - B0·A0 = [B | -B0]·[A ; A0]: a plain LoRA adapter of rank 2r, with the same scaling once alpha doubles with r,
on the ORIGINAL weight. That is PEFT's ``subtract_mutated_init``, which ``save_pretrained(...,
path_initial_model_for_weight_conversion=DIR)`` runs by loading the start from DIR into the live model as a second
adapter; under ZeRO-3 that model sits partitioned inside the engine. Here the same arithmetic runs on the adapter
file Trainer has already gathered and saved, with the start kept in memory since the model was wrapped
(``adapter_snapshot``), so it is the same for every engine.

The run's checkpoints stay as trained (they resume onto the residual base); only the final adapter is converted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model_state_dict
from peft.utils import SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME, load_peft_weights
from peft.utils.integrations import gather_params_ctx
from safetensors.torch import save_file

__all__ = ["adapter_snapshot", "adapter_set_to", "converted_weights", "write_plain_adapter"]


def adapter_snapshot(model: PeftModel) -> dict[str, torch.Tensor]:
    """Every adapter tensor of ``model`` as it is now, copied to the CPU and keyed as a saved adapter keys them.
    Taken right after wrapping, before any engine exists: the adapter's weights are whole then, also under ZeRO-3
    (only the weights ``from_pretrained`` loaded are partitioned)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in get_peft_model_state_dict(model).items()}


def _saved_name(parameter_name: str, adapter_name: str) -> str:
    return parameter_name.replace(f".{adapter_name}.", ".")


@contextmanager
def adapter_set_to(model: PeftModel, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """Inside, the adapter holds ``weights`` (an ``adapter_snapshot``); after, what it held before. Under ZeRO-3
    each tensor is gathered on its own and rank 0's copy is kept (every rank holds the same snapshot)."""
    adapter = model.active_adapter
    params = [(name, p) for name, p in model.named_parameters() if _saved_name(name, adapter) in weights]
    kept = {}
    for name, param in params:
        with gather_params_ctx(param, modifier_rank=0):
            kept[name] = param.data.detach().to("cpu", copy=True)
            param.data.copy_(weights[_saved_name(name, adapter)])
    try:
        yield
    finally:
        for name, param in params:
            with gather_params_ctx(param, modifier_rank=0):
                param.data.copy_(kept[name])


def converted_weights(trained: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``[A ; A0]`` and ``[B | -B0]`` for every adapted module (the module docstring's arithmetic); other tensors
    (``modules_to_save``) as they are."""
    converted = {}
    for name, tensor in trained.items():
        if ".lora_A." in name or ".lora_embedding_A" in name:
            converted[name] = torch.cat([tensor, start[name].to(tensor.dtype)], dim=0)
        elif ".lora_B." in name or ".lora_embedding_B" in name:
            converted[name] = torch.cat([tensor, -start[name].to(tensor.dtype)], dim=1)
        else:
            converted[name] = tensor
    return converted


def _doubled_rank(config: LoraConfig) -> None:
    """Rank 2r at the same scaling, as PEFT's ``save_pretrained`` writes a converted adapter's config; a patterned
    module's alpha grows as the global one (PEFT doubles it, and documents rsLoRA with a pattern as unsupported)."""
    alpha_factor = 2**0.5 if config.use_rslora else 2  # rsLoRA scales by alpha / sqrt(r)
    config.r *= 2
    config.lora_alpha *= alpha_factor
    config.rank_pattern = {key: 2 * value for key, value in (config.rank_pattern or {}).items()}
    config.alpha_pattern = {key: alpha_factor * value for key, value in (config.alpha_pattern or {}).items()}


def write_plain_adapter(adapter_dir: str | os.PathLike, start: dict[str, torch.Tensor] | None) -> bool:
    """Rewrite the adapter saved in ``adapter_dir`` as a plain LoRA adapter for the original base: converted from
    its ``start`` when one is given, and in every case with PEFT's default initialisation in its config, so a loader
    builds plain LoRA layers and only reads the weights (with an init name there, PEFT would redo that init on load;
    for PiSSA, rewrite the base again). Returns False when the weights are still exactly their start: never trained.
    """
    adapter_dir = Path(adapter_dir)
    config = LoraConfig.from_pretrained(str(adapter_dir))
    moved = True
    if start is not None:
        trained = load_peft_weights(str(adapter_dir), device="cpu")
        moved = any(
            not torch.equal(tensor, start[name].to(tensor.dtype)) for name, tensor in trained.items() if name in start
        )
        weights = {name: tensor.contiguous() for name, tensor in converted_weights(trained, start).items()}
        if (adapter_dir / SAFETENSORS_WEIGHTS_NAME).is_file():
            save_file(weights, str(adapter_dir / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})
        else:
            torch.save(weights, adapter_dir / WEIGHTS_NAME)
        _doubled_rank(config)
    config.init_lora_weights = True
    config.eva_config = config.corda_config = None
    config.loftq_config = {}
    config.save_pretrained(str(adapter_dir))
    return moved
