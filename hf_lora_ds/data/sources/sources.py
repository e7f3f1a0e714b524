"""Where records come from: a file, a folder of shards, a ``save_to_disk`` directory, a Hub dataset, or a mixture.

``--train_file`` / ``--eval_file`` take one source or several with weights (``a.jsonl:0.7,b_dir:0.3``); each becomes a
memory-mapped record table (hf_lora_ds.data.records.record_table) whose rows keep their file and line for later errors.
A mixture is as long as its sources together, each supplying its weight's share without replacement, shuffled from one
generator seeded with ``--seed`` (so it repeats exactly); it is a view of the sources' rows, not a copy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.record_table import RecordTable, from_list, from_rows, read_file
from hf_lora_ds.data.sources.dataset_info import INFO_NAME, InfoEntry, info_file, read_entries
from hf_lora_ds.distributed import main_process_first

__all__ = ["Source", "LoadedData", "parse_sources", "load_data", "mix"]

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)", re.IGNORECASE)
_HUB_ID = re.compile(r"(?P<name>[\w.-]+(/[\w.-]+)?)(:(?P<config>[\w.-]+))?(@(?P<split>[\w.:%+\[\]-]+))?")


@dataclass(frozen=True)
class Source:
    """One entry of ``--train_file``: where the records are and, in a mixture, its weight."""

    location: str
    weight: float | None = None


@dataclass
class LoadedData:
    """Records in training order, as a table with ``record``, ``where`` and ``source`` columns, and the number of
    samples each source supplies, in the order the sources were given; ``formats``: how the records of a source are
    read where it says so itself (an entry of LLaMA-Factory's ``dataset_info.json``), by source."""

    table: datasets.Dataset
    source_counts: dict[str, int]
    formats: dict[str, FormatOptions] = field(default_factory=dict)

    @property
    def records(self) -> RecordTable:
        return RecordTable(self.table)

    def counts(self) -> dict[str, int]:
        """Samples per source, in the order the sources were given."""
        return dict(self.source_counts)

    def summary(self) -> str:
        parts = ", ".join(f"{name}: {count}" for name, count in self.source_counts.items())
        return f"data: {len(self.table)} samples from {len(self.source_counts)} source(s) ({parts})"


def parse_sources(spec: str | list[Any]) -> list[Source]:
    """``"a.jsonl:0.7,b_dir:0.3"``, or a YAML list of such strings or of ``{path, weight}`` objects."""
    entries = [e.strip() for e in spec.split(",")] if isinstance(spec, str) else list(spec)
    mixture = len(entries) > 1
    sources = []
    for entry in entries:
        if isinstance(entry, dict):
            location, weight = str(entry.get("path", "")), _weight(entry.get("weight"), entry.get("path"), mixture)
        else:
            location, weight = _split_weight(str(entry), mixture)
        if not location:
            raise DataError(f"--train_file {spec!r}: an entry has no path or dataset name")
        sources.append(Source(location, weight))
    return sources


def _split_weight(entry: str, mixture: bool) -> tuple[str, float | None]:
    """``path:weight``; outside a mixture a last part that is not a number is a Hub config (``name:config``)."""
    head, sep, tail = entry.rpartition(":")
    if sep and (mixture or _NUMBER.fullmatch(tail.strip())):
        return head.strip(), _weight(tail.strip(), head.strip(), mixture)
    if mixture:
        raise DataError(f"mixture source {entry!r}: no weight; write it as {entry}:WEIGHT (a positive number)")
    return entry, None


def _weight(value: Any, location: Any, mixture: bool) -> float | None:
    if value is None and not mixture:
        return None
    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise DataError(f"mixture source {location!r}: weight {value!r} is not a positive number")
    return weight


def _load_table(
    location: str, trust_remote_code: bool, cache_dir: str | Path | None, source: str | None = None
) -> datasets.Dataset:
    """The records of one source, whose rows are named ``source`` (default: its location)."""
    path = Path(location)
    if path.is_file():
        return read_file(path, source or location, cache_dir)
    if path.is_dir():
        return _load_directory(path, source or location, cache_dir)
    if path.suffix.lower() in DATA_SUFFIXES:
        raise FileNotFoundError(f"data file not found: {path} (check --train_file / --eval_file)")
    return from_rows(_load_hub(location, trust_remote_code), location, cache_dir)


def _load_directory(path: Path, location: str, cache_dir: str | Path | None) -> datasets.Dataset:
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        dataset = datasets.load_from_disk(str(path))
        if isinstance(dataset, datasets.DatasetDict):
            if "train" not in dataset:
                raise DataError(f"{path}: a DatasetDict without a 'train' split (splits: {sorted(dataset)})")
            dataset = dataset["train"]
        return from_rows(dataset, str(path), cache_dir)
    shards = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
    if not shards:
        raise DataError(
            f"{path}: no data files (.json, .jsonl, .parquet) in this directory, and it is not a "
            "datasets.save_to_disk directory"
        )
    return datasets.concatenate_datasets([read_file(shard, location, cache_dir) for shard in shards])


def _load_hub(location: str, trust_remote_code: bool) -> datasets.Dataset:
    """A Hub dataset by id; with no network (HF_DATASETS_OFFLINE) only what datasets has cached resolves."""
    match = _HUB_ID.fullmatch(location)
    if not match:
        raise FileNotFoundError(
            f"{location}: no such file or directory, and not a Hub dataset id (name[:config][@split])"
        )
    name, config, split = match["name"], match["config"], match["split"] or "train"
    # datasets >= 4 runs no dataset scripts, so only older versions take trust_remote_code.
    extra = {"trust_remote_code": True} if trust_remote_code and datasets.__version__ < "4" else {}
    try:
        return datasets.load_dataset(name, config, split=split, **extra)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "cannot load this source"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"{location}: no such file or directory, and the Hub dataset {name!r} (config {config}, split {split}) "
            f"cannot be loaded: {reason}"
        ) from None


def load_data(
    spec: str | Path | list[dict],
    seed: int = 0,
    trust_remote_code: bool = False,
    cache_dir: str | Path | None = None,
    dataset: str | None = None,
) -> LoadedData:
    """Records of ``spec``: one source or several mixed by weight (``--train_file`` text), or a list of records;
    a ``dataset_info.json`` (or its folder) with the entries ``dataset`` names (``--dataset a,b``).

    On a multi-rank run rank 0 reads the sources into the cache first; the other ranks then read its tables.
    """
    if isinstance(spec, list):
        return LoadedData(from_list(spec), {"records": len(spec)})
    sources = parse_sources(str(spec))
    info = info_file(sources[0].location) if len(sources) == 1 else None
    if info is not None:
        return _load_entries(read_entries(info, dataset), seed, cache_dir)
    if dataset:
        raise DataError(
            f"--dataset {dataset}: names entries of LLaMA-Factory's {INFO_NAME}, and --train_file {spec} "
            f"is no {INFO_NAME} (nor a folder holding one)"
        )
    for source in sources:
        if info_file(source.location):
            raise DataError(
                f"mixture source {source.location!r}: a {INFO_NAME} cannot be a part of a mixture; give "
                "it alone with --dataset NAME[,NAME]"
            )
    with main_process_first():
        loaded = [(source, _load_table(source.location, trust_remote_code, cache_dir)) for source in sources]
    if len(loaded) == 1:
        source, table = loaded[0]
        return LoadedData(table, {source.location: len(table)})
    return mix(loaded, seed)


def _load_entries(entries: list[InfoEntry], seed: int, cache_dir: str | Path | None) -> LoadedData:
    """The entries' files, each a source named after its entry, concatenated (as LLaMA-Factory mixes them) and
    shuffled; each read with its entry's columns and tags."""
    with main_process_first():
        tables = [(entry, _load_table(str(entry.path), False, cache_dir, source=entry.name)) for entry in entries]
    formats = {entry.name: entry.formats for entry in entries}
    if len(tables) == 1:
        return LoadedData(tables[0][1], {entries[0].name: len(tables[0][1])}, formats)
    mixed = mix([(Source(entry.name, max(len(table), 1)), table) for entry, table in tables], seed)
    mixed.formats = formats
    return mixed


def mix(parts: list[tuple[Source, datasets.Dataset]], seed: int) -> LoadedData:
    """Draw each source's share of the sources' total length and shuffle them together, reproducibly."""
    counts = _shares(sum(len(table) for _, table in parts), [source.weight for source, _ in parts])
    rng = np.random.default_rng(seed)
    picked, offset = [], 0
    for (source, table), count in zip(parts, counts):
        if not len(table):
            raise DataError(f"mixture source {source.location!r}: no records")
        picked.append(offset + _draw(len(table), count, rng))
        offset += len(table)
    indices = np.concatenate(picked)
    order = rng.permutation(len(indices))
    source_counts: dict[str, int] = {}
    for (source, _), count in zip(parts, counts):
        source_counts[source.location] = source_counts.get(source.location, 0) + count
    mixed = datasets.concatenate_datasets([table for _, table in parts]).select(indices[order])
    return LoadedData(mixed, source_counts)


def _shares(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` (largest remainder), so the counts add up exactly."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _draw(size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` indices into ``size`` records: whole shuffled passes, then a sample without replacement."""
    passes, rest = divmod(count, size)
    return np.concatenate([rng.permutation(size) for _ in range(passes)] + [rng.choice(size, rest, replace=False)])
