"""Third-party output a user of a run can do nothing about, kept out of it; everything else still shows.

Each of these is matched narrowly, by its own message or import, never by category or logger level:

- transformers 5 warns ``FutureWarning: `is_gradient_checkpointing` is deprecated`` every time PEFT wraps a model
  (``PeftModel.__init__`` reads the old attribute; the planner and the adapter check wrap meta copies too). The fix
  is PEFT's; every other FutureWarning still shows.
- bitsandbytes, on a CPU with AVX512-BF16, logs "Failed to load CPU gemm_4bit_forward from kernels-community" when
  imported (it falls back to its own kernel), and PEFT imports it wherever it is installed: every LoRA wrap
  (``get_peft_model`` dispatches to its 4/8-bit layers), also on runs that quantize nothing. The filter sits on the
  very logger that emits it: a parent logger's filters never see records its children propagate. PEFT's own import
  (``peft/helpers.py``) is also made without bitsandbytes, so parsing a run's arguments does not pay its import;
  hf_lora_ds.model.quantization gives the helper its module back.
- torch 2.13 deprecates ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, which DeepSpeed's ZeRO calls at
  every step: a FutureWarning pair per step and rank (something resets the "once" registry). The fix is DeepSpeed's.
- DeepSpeed logs "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
  whenever it is imported on a machine without one (the planner reads DeepSpeed's config schema on every run). The
  run's own first line already names the device it trains on (``device cpu``).
"""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = [
    "QUIETED_BITSANDBYTES_LOG",
    "QUIETED_COLLECTIVE_WARNING",
    "QUIETED_DEEPSPEED_LOG",
    "QUIETED_WARNING",
    "give_peft_bitsandbytes",
    "quiet_third_party_noise",
]

QUIETED_WARNING = r"`is_gradient_checkpointing` is deprecated"  # the start of transformers' message
QUIETED_COLLECTIVE_WARNING = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
QUIETED_DEEPSPEED_LOG = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
QUIETED_BITSANDBYTES_LOG = "Failed to load CPU gemm_4bit_forward from kernels-community: "  # then the import error
# The logger that emits each line (the filter must sit on it, see the module doc) and the line, or its start.
_QUIETED_LOGS = {
    "DeepSpeed": (QUIETED_DEEPSPEED_LOG, False),  # the logger DeepSpeed creates, by name, when imported
    "bitsandbytes.backends.cpu.ops": (QUIETED_BITSANDBYTES_LOG, True),  # its module's logger(__name__)
}


class _DropMessage(logging.Filter):
    def __init__(self, message: str, is_prefix: bool) -> None:
        super().__init__()
        self.message = message
        self.is_prefix = is_prefix

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith(self.message) if self.is_prefix else text == self.message)


def quiet_third_party_noise() -> None:
    """Install the filters and import PEFT without bitsandbytes; idempotent. Call it before PEFT is imported (the
    package does, first thing in ``hf_lora_ds/__init__.py``)."""
    for message in (QUIETED_WARNING, QUIETED_COLLECTIVE_WARNING):
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    for name, (message, is_prefix) in _QUIETED_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(message, is_prefix))
    _import_peft_without_bitsandbytes()


def _import_peft_without_bitsandbytes() -> None:
    if "peft" in sys.modules or "bitsandbytes" in sys.modules:
        return  # imported already, by the user's code: nothing left to spare
    try:
        import transformers  # noqa: F401  (imported first: only PEFT's own import may see bitsandbytes hidden)
    except ImportError:
        return  # named by the import that needs it (python -m hf_lora_ds.doctor lists every one)
    sys.modules["bitsandbytes"] = None  # `import bitsandbytes` raises ImportError, the case peft/helpers.py handles
    try:
        import peft  # noqa: F401
    except ImportError:
        pass  # as transformers above
    finally:
        del sys.modules["bitsandbytes"]


def give_peft_bitsandbytes() -> None:
    """Hand the now imported bitsandbytes to the PEFT helper that was imported without it."""
    import bitsandbytes
    import peft.helpers

    if getattr(peft.helpers, "bnb", bitsandbytes) is None:
        peft.helpers.bnb = bitsandbytes
