"""Say what is wrong with a ``--model_name_or_path`` before transformers gives a misleading reason.

transformers treats whatever is not an existing directory as a hub id, so a mistyped local path ends in
``Repo id must be in the form 'repo_name' or 'namespace/repo_name'``, and a directory without tokenizer files ends in
``You need to have sentencepiece or tiktoken installed`` (it falls back to converting a slow tokenizer). Here a
local directory is checked for what a LoRA run reads from it (config.json, tokenizer files, weights), and a hub id
that cannot be fetched is reported as such, saying when the machine is offline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.resources import MODEL_CONFIGS

__all__ = ["looks_like_local_path", "check_model_source", "hub_load_errors", "load_model_config"]

# Any one of these holds a vocabulary a tokenizer can be built from (fast, BPE, sentencepiece, WordPiece, tiktoken).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")


def looks_like_local_path(name_or_path: str) -> bool:
    """True when the user evidently meant a directory: it exists, or it cannot be a hub id (``org/name``)."""
    return (
        os.path.exists(name_or_path)
        or name_or_path.startswith((".", "/", "~"))
        or name_or_path.endswith("/")
        or "\\" in name_or_path
        or name_or_path.count("/") > 1
    )


def check_model_source(
    name_or_path: str, flag: str = "--model_name_or_path", *, need_tokenizer: bool = True, need_weights: bool = True
) -> None:
    """Raise a ``UserError`` naming ``flag`` when a local model directory cannot serve the run, or when a hub id can
    only come from a local cache that does not hold it (``HF_HUB_OFFLINE``)."""
    if looks_like_local_path(name_or_path):
        _check_directory(Path(name_or_path).expanduser(), flag, need_tokenizer, need_weights)
    elif _hub_offline() and not _in_hub_cache(name_or_path):
        raise UserError(
            f"{flag} {name_or_path}: no such local directory, and as a Hugging Face Hub id it is not in the local "
            "cache while HF_HUB_OFFLINE is set; download it on a machine with network access (huggingface-cli "
            "download) or pass a local model directory"
        )


def _check_directory(path: Path, flag: str, need_tokenizer: bool, need_weights: bool) -> None:
    if not path.exists():
        raise MissingPathError(f"{flag} {path}: no such directory; pass a saved model directory or a hub id (org/name)")
    if not path.is_dir():
        raise UserError(f"{flag} {path}: is a file, not a model directory; pass the directory that holds config.json")
    if not (path / "config.json").is_file():
        raise UserError(
            f"{flag} {path}: the directory has no config.json, so it is not a saved model; pass the directory written "
            "by save_pretrained (the one holding config.json)"
        )
    names = [entry.name for entry in path.iterdir()]
    if need_tokenizer and not any(name in _TOKENIZER_FILES or name.endswith(".tiktoken") for name in names):
        raise UserError(
            f"{flag} {path}: the directory has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save the "
            "tokenizer there too (tokenizer.save_pretrained) or copy its files from the original model"
        )
    if need_weights and not any(name.endswith(_WEIGHT_SUFFIXES) for name in names):
        raise UserError(
            f"{flag} {path}: the directory has no weights (no *.safetensors or *.bin files); save the model with "
            "save_pretrained or copy its weight files from the original model"
        )


def _hub_offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


@contextmanager
def hub_load_errors(name_or_path: str, flag: str = "--model_name_or_path") -> Iterator[None]:
    """Turn the ``OSError`` that ``from_pretrained`` raises for a hub id it cannot fetch into a ``UserError``.

    Local directories were checked by ``check_model_source``; an ``OSError`` for one of them is left alone (a
    truncated weight file, for example, is better shown with its traceback).
    """
    try:
        yield
    except OSError as err:
        if looks_like_local_path(name_or_path):
            raise
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{flag} {name_or_path}: no such local directory, and fetching it from the Hugging Face Hub failed "
            f"({first_line}); check the id and the network (offline machines need it downloaded first, then "
            "HF_HUB_OFFLINE=1), or pass a local model directory"
        ) from err


def load_model_config(path: str, trust_remote_code: bool = False) -> PretrainedConfig:
    """A model directory (or its ``config.json``) as a transformers config; a bad path is a one-line error."""
    if os.path.isfile(path):
        try:
            data = json.loads(open(path, encoding="utf-8").read())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"{path}: not a JSON model config ({err})") from None
        if "model_type" not in data:
            raise UserError(f"{path}: no 'model_type' key; is this a transformers config.json?")
        return AutoConfig.for_model(**data)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise MissingPathError(f"--model_name_or_path {path}: the directory has no config.json")
    if not os.path.isdir(path) and (path.startswith((".", "/", "~")) or path.count("/") > 1):
        raise MissingPathError(f"--model_name_or_path {path}: no such directory or config.json")
    shipped = MODEL_CONFIGS / path.rsplit("/", 1)[-1].lower() / "config.json"
    if not os.path.isdir(path) and shipped.is_file():  # a hub id whose architecture numbers ship here: no download
        return load_model_config(str(shipped))
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise UserError(f"--model_name_or_path {path}: cannot read its config ({str(err).splitlines()[0]})") from None
