"""GGUF bases: a llama.cpp / Ollama ``.gguf`` file as the model to fine-tune, merge into or evaluate.

transformers reads GGUF itself (``from_pretrained(dir, gguf_file=name)``: config, tokenizer with its chat template,
weights dequantized to the requested dtype), but it needs the ``gguf`` package, and its failures on a bad file are a
``ValueError`` deep in a reader ("GGUF magic invalid", a numpy dtype complaint for a truncated file). Here the file
is checked up front, so a wrong path, a missing package, a corrupt file or an architecture transformers cannot load
is one line that names the flag. A loaded model still carries the GGUF quantizer marker, which makes
``save_pretrained`` refuse ("not serializable") and Trainer treat the dequantized weights as quantized; ``plain_model``
drops it, since the tensors are ordinary dense ones.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.source import check_model_source

__all__ = ["GGUF_EXTRA", "model_source", "gguf_config", "plain_model"]

GGUF_EXTRA = "pip install 'hf_lora_ds[gguf]' (or: pip install gguf)"


def model_source(
    name_or_path: str,
    gguf_file: str | None = None,
    flag: str = "--model_name_or_path",
    *,
    need_tokenizer: bool = True,
    need_weights: bool = True,
) -> tuple[str, dict]:
    """``(path, from_pretrained kwargs)`` for a base given as a directory or hub id, a directory plus ``gguf_file``,
    or a path to a ``.gguf`` file; checked first so a bad source is one line naming ``flag``."""
    if gguf_file is None and not name_or_path.lower().endswith(".gguf"):
        check_model_source(name_or_path, flag, need_tokenizer=need_tokenizer, need_weights=need_weights)
        return name_or_path, {}
    path = Path(name_or_path).expanduser()
    if gguf_file is not None:
        path = path / gguf_file
    check_gguf_file(path, f"--gguf_file {gguf_file}" if gguf_file else flag)
    return str(path.parent), {"gguf_file": path.name}


def gguf_config(name_or_path: str, gguf_file: str | None) -> PretrainedConfig | None:
    """The config of a GGUF base (for the memory planner, which reads no weights), None for any other base."""
    if gguf_file is None and not name_or_path.lower().endswith(".gguf"):
        return None
    source, kwargs = model_source(name_or_path, gguf_file)
    return AutoConfig.from_pretrained(source, **kwargs)


def check_gguf_file(path: Path, flag: str) -> None:
    """Raise a ``UserError`` unless transformers can build a model from the GGUF file at ``path``."""
    if not path.is_file():
        raise MissingPathError(f"{flag}: {path}: no such GGUF file")
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"{flag}: reading {path} needs the gguf package, which is not installed: {GGUF_EXTRA}")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        load_gguf_checkpoint(str(path), return_tensors=False)  # header, config and vocabulary; no tensor data
    except ValueError as err:  # also what gguf raises for a bad magic or a truncated file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "is not supported" in reason:
            raise UserError(f"{flag}: {path}: transformers cannot load this GGUF model ({reason})") from err
        raise UserError(f"{flag}: {path}: not a readable GGUF file ({reason}); is it complete?") from err


def plain_model(model: PreTrainedModel) -> PreTrainedModel:
    """Drop the GGUF quantizer marker from a model loaded with ``gguf_file``: its weights are already dense."""
    if getattr(getattr(model.config, "quantization_config", None), "quant_method", None) == "gguf":
        del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
    return model
