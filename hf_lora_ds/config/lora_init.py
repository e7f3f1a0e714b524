"""``--lora_init`` parsed once into what the adapter's start is and needs; every other module reads these fields,
as PEFT dispatches its own ``init_lora_weights`` in one place (``peft.tuners.lora.layer``)."""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

from hf_lora_ds.errors import UserError

__all__ = ["INITS", "DataPass", "LoraInit", "lora_init_from_peft", "parse_lora_init"]

# --lora_init -> what it costs and gives, one line each (the flag's help and docs/lora.md's table say the same).
INITS: dict[str, str] = {
    "default": "A random, B zero: starts exactly at the base (Microsoft's LoRA)",
    "gaussian": "as default with A drawn from N(0, 1/r)",
    "pissa": "A, B from each weight's top-r singular vectors, the base keeps the residual: one SVD per weight at start",
    "pissa_niter_N": "PiSSA with a randomized SVD of N subspace iterations: seconds instead of minutes on big weights",
    "olora": "A, B from each weight's QR decomposition, the base keeps the residual",
    "eva": "A from the SVD of each layer's inputs over --lora_init_samples training samples, ranks redistributed",
    "corda": "A, B from each weight's SVD weighted by its inputs' covariance over --lora_init_samples samples",
    "loftq": "--load_in_4bit only: A, B fit to each weight's 4-bit quantisation error (rank r of it)",
    "orthogonal": "A, B random orthogonal (even rank): not zero, so the model starts slightly off the base",
}
_PISSA_NITER = re.compile(r"pissa_niter_(\d+)")
_REWRITE_BASE = ("pissa", "olora", "corda")


class DataPass(enum.Enum):
    """The base run over training samples before step 1: EVA's after wrapping, CorDA's before."""

    EVA = "eva"
    CORDA = "corda"


@dataclass(frozen=True)
class LoraInit:
    """How the adapter starts. ``rewrites_base``: PEFT rewrites the base weights to their residual, so the saved
    adapter is converted into a plain one for the original base (hf_lora_ds.model.adapter_conversion)."""

    name: str  # as the flag spells it, for messages
    family: str  # pissa_niter_16 -> pissa; every other name is its own family
    peft_value: bool | str  # PEFT's init_lora_weights
    data_pass: DataPass | None
    rewrites_base: bool
    loftq: bool  # fit to the 4-bit quantisation error after wrapping (hf_lora_ds.model.quantization.fit_loftq)
    needs_even_rank: bool
    plain: bool  # Microsoft's LoRA: nothing to say about the start


@functools.cache
def parse_lora_init(name: str) -> LoraInit:
    """The flag's value as a description; an unknown or malformed name is one error line."""
    if name.startswith("pissa_niter_") and not _PISSA_NITER.fullmatch(name):
        raise UserError(
            f"--lora_init {name}: N in pissa_niter_N is the number of subspace iterations, a whole "
            "number such as pissa_niter_4"
        )
    if name not in INITS and not _PISSA_NITER.fullmatch(name):
        raise UserError(f"--lora_init {name}: unknown; use one of {', '.join(INITS)} (N: subspace iterations)")
    family = "pissa" if _PISSA_NITER.fullmatch(name) else name
    # PEFT's own LoftQ quantizes a full-precision base itself on a CUDA device, so LoftQ starts as default LoRA and
    # the fit to the 4-bit base is done after wrapping.
    return LoraInit(
        name=name,
        family=family,
        peft_value=True if family in ("default", "loftq") else name,
        data_pass=DataPass(family) if family in ("eva", "corda") else None,
        rewrites_base=family in _REWRITE_BASE,
        loftq=family == "loftq",
        needs_even_rank=family == "orthogonal",
        plain=family == "default",
    )


def lora_init_from_peft(init_lora_weights: bool | str) -> LoraInit:
    """The description of an adapter built elsewhere, from its PEFT ``init_lora_weights``; a value with no flag of
    its own (``False``: B random too) is described by its name only."""
    if init_lora_weights is True:
        return parse_lora_init("default")
    name = str(init_lora_weights)
    if name in INITS or _PISSA_NITER.fullmatch(name):
        return parse_lora_init(name)
    return LoraInit(name, name, init_lora_weights, None, False, False, False, False)
