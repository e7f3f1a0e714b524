"""LLaMA-Factory's ``dataset_info.json``: ``--train_file path/to/dataset_info.json`` (or its folder) ``--dataset a,b``.

Every LLaMA-Factory user has one: a JSON object of named entries, each a data file (``file_name``, relative to the
file's folder) read as ``formatting`` ``alpaca`` (the default) or ``sharegpt``, with its own column names
(``columns``) and, for ShareGPT, its own turn keys and speaker names (``tags``). Each named entry becomes a source of
its own, read with its own ``FormatOptions``; several entries are concatenated, as LLaMA-Factory concatenates them,
and shuffled. An entry's ``images`` column is read with relative paths under the file's folder, LLaMA-Factory's
default ``media_dir`` (whether the model takes images is the run's to say, record by record). An entry this package
cannot serve is refused in one line naming it: preference data (``ranking``, ``chosen``/``rejected``, ``kto_tag``),
video or audio columns, an entry with no local file (``hf_hub_url``, ``ms_hub_url``, ``script_url``: no hub is
reached from here), or ``num_samples``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.records import DataError

__all__ = ["INFO_NAME", "InfoEntry", "info_file", "read_entries"]

INFO_NAME = "dataset_info.json"
# LLaMA-Factory's column names -> the fields this package reads, per formatting.
_ALPACA_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "history": "history",
    "system": "system",
    "tools": "tools",
    "images": "images",
}
_SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system", "tools": "tools", "images": "images"}
# ShareGPT tags: LLaMA-Factory's names and defaults -> the role each speaker name stands for.
_TAG_ROLES = {
    "user_tag": ("human", "user"),
    "assistant_tag": ("gpt", "assistant"),
    "observation_tag": ("observation", "tool"),
    "function_tag": ("function_call", "function_call"),
    "system_tag": ("system", "system"),
}
_UNSERVABLE_COLUMNS = {
    "videos": "multimodal (videos)",
    "audios": "multimodal (audios)",
    "chosen": "preference (chosen/rejected)",
    "rejected": "preference (chosen/rejected)",
    "kto_tag": "KTO (kto_tag)",
}
_SAVED_DATASET_FILES = ("state.json", "dataset_dict.json")  # datasets.save_to_disk's, beside its own dataset_info.json
_REMOTE_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


@dataclass(frozen=True)
class InfoEntry:
    """One named entry: its data file and how to read it."""

    name: str
    path: Path
    formats: FormatOptions


def info_file(location: str) -> Path | None:
    """The LLaMA-Factory ``dataset_info.json`` that ``location`` names (the file, or a folder holding one), else
    None; a ``datasets.save_to_disk`` folder holds a file of that name too (with its ``state.json``): not this."""
    path = Path(location)
    info = path if path.is_file() and path.name == INFO_NAME else path / INFO_NAME if path.is_dir() else None
    if info is None or not info.is_file() or any((info.parent / name).is_file() for name in _SAVED_DATASET_FILES):
        return None
    return info


def read_entries(info: Path, names: str | None) -> list[InfoEntry]:
    """The entries ``names`` (``--dataset a,b``) of ``info``, each checked; a missing or unservable one is refused."""
    entries = _load(info)
    if not names:
        raise DataError(
            f"{info}: LLaMA-Factory's {INFO_NAME}, not a data file; name the entries to train on with "
            f"--dataset NAME[,NAME] (entries: {_listed(entries)})"
        )
    chosen = []
    for name in (part.strip() for part in names.split(",")):
        if name not in entries:
            raise DataError(f"{info}: no entry {name!r} (--dataset); entries: {_listed(entries)}")
        chosen.append(_entry(info, name, entries[name]))
    return chosen


def _load(info: Path) -> dict[str, Any]:
    try:
        entries = json.loads(info.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{info}, line {err.lineno}: malformed JSON (Python's json parser: {err})") from None
    if not isinstance(entries, dict) or not all(isinstance(entry, dict) for entry in entries.values()):
        raise DataError(f"{info}: expected an object of named entries, each an object (LLaMA-Factory's {INFO_NAME})")
    return entries


def _listed(entries: dict[str, Any]) -> str:
    names = sorted(entries)
    return ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")


def _entry(info: Path, name: str, entry: dict[str, Any]) -> InfoEntry:
    where = f"{info}, entry {name!r}"
    columns = entry.get("columns") or {}
    if entry.get("ranking"):
        raise DataError(f"{where}: a ranking (preference) dataset, not SFT data; choose an SFT entry")
    for column, what in _UNSERVABLE_COLUMNS.items():
        if column in columns:
            raise DataError(f"{where}: columns.{column}: {what} data, which this package cannot train on")
    if "num_samples" in entry:
        raise DataError(
            f"{where}: num_samples is not supported; subsample the file, or weigh it in a --train_file mixture"
        )
    if "file_name" not in entry:
        remote = next((key for key in _REMOTE_KEYS if key in entry), None)
        because = f"{remote} {entry[remote]!r}: no hub is reached from here" if remote else "no file_name"
        raise DataError(f"{where}: {because}; download the data and give its file as file_name")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("alpaca", "sharegpt"):
        raise DataError(f"{where}: formatting {formatting!r}; LLaMA-Factory's are 'alpaca' and 'sharegpt'")
    known = _ALPACA_COLUMNS if formatting == "alpaca" else _SHAREGPT_COLUMNS
    for column in columns:
        if column not in known:
            raise DataError(f"{where}: columns.{column} is not a {formatting} column (those are {sorted(known)})")
    mapping = {known[column]: str(value) for column, value in columns.items() if value}
    options = _options(where, formatting, mapping, entry.get("tags"), str(info.parent))
    return InfoEntry(name, info.parent / entry["file_name"], options)


def _options(where: str, formatting: str, columns: dict[str, str], tags: Any, media_dir: str) -> FormatOptions:
    if formatting == "alpaca":
        if tags:
            raise DataError(f"{where}: tags are for sharegpt entries only")
        return FormatOptions(columns=columns, image_dir=media_dir)
    tags = tags or {}
    unknown = set(tags) - {*_TAG_ROLES, "role_tag", "content_tag"}
    if unknown:
        raise DataError(f"{where}: unknown tags {sorted(unknown)}")
    roles = {str(tags.get(tag, default)): role for tag, (default, role) in _TAG_ROLES.items()}
    keys = (str(tags.get("role_tag", "from")), str(tags.get("content_tag", "value")))
    return FormatOptions(columns=columns, sharegpt_roles=roles, turn_keys=keys, image_dir=media_dir)
