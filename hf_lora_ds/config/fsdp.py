"""transformers' ``--fsdp_config`` read as one dict, whichever form it was given in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["fsdp_settings", "fsdp_version_2"]


def fsdp_settings(config: Any) -> dict:
    """transformers' ``fsdp_config`` (a dict or a JSON file) as a dict without the optional ``fsdp_`` prefixes."""
    if not config:
        return {}
    if isinstance(config, dict):
        return {key.removeprefix("fsdp_"): value for key, value in config.items()}
    return {key.removeprefix("fsdp_"): value for key, value in json.loads(Path(config).read_text()).items()}


def fsdp_version_2(config: Any) -> bool:
    """Whether the config asks for FSDP2 (transformers' default when it names no version)."""
    return str(fsdp_settings(config).get("version", 2)) == "2"
