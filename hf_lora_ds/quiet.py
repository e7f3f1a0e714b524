"""Third-party output a user of a run can do nothing about, kept out of it; everything else still shows.

Each of these is matched narrowly, by its own message or import, never by category or logger level:

- transformers 5 warns ``FutureWarning: `is_gradient_checkpointing` is deprecated`` every time PEFT wraps a model
  (``PeftModel.__init__`` reads the old attribute; the planner and the adapter check wrap meta copies too). The fix
  is PEFT's; every other FutureWarning still shows.
- PEFT 0.21 imports bitsandbytes when PEFT itself is imported (``peft/helpers.py``, for one helper that dequantizes
  quantized weights); everywhere else PEFT imports it only when a quantized layer is met (PEFT PR 1230 made that
  lazy). bitsandbytes takes seconds to import, and on a CPU with AVX512-BF16 it logs "Failed to load CPU
  gemm_4bit_forward from kernels-community" on every command line, also on runs that quantize nothing. PEFT is
  therefore imported with bitsandbytes hidden from that one import, so a run imports bitsandbytes only when it asks
  for quantization (hf_lora_ds.model.quantization, which gives the helper its module back).
- DeepSpeed logs "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
  whenever it is imported on a machine without one (the planner reads DeepSpeed's config schema on every run). The
  run's own first line already names the device it trains on (``device cpu``).
"""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = ["QUIETED_WARNING", "QUIETED_DEEPSPEED_LOG", "give_peft_bitsandbytes", "quiet_third_party_noise"]

QUIETED_WARNING = r"`is_gradient_checkpointing` is deprecated"  # the start of transformers' message
QUIETED_DEEPSPEED_LOG = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."


class _DropMessage(logging.Filter):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message


def quiet_third_party_noise() -> None:
    """Install the filters and import PEFT without bitsandbytes; idempotent. Call it before PEFT is imported (the
    package does, first thing in ``hf_lora_ds/__init__.py``)."""
    warnings.filterwarnings("ignore", message=QUIETED_WARNING, category=FutureWarning)
    deepspeed_logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed creates, by name, when imported
    if not any(isinstance(f, _DropMessage) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropMessage(QUIETED_DEEPSPEED_LOG))
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
