"""Where records come from: a file, a folder of shards, a ``save_to_disk`` directory, a Hub dataset, or a mixture.

``--train_file`` / ``--eval_file`` take one source or several with weights (``a.jsonl:0.7,b_dir:0.3``). A source
is, in this order: a ``.json``/``.jsonl``/``.parquet`` file; a directory written by ``datasets.save_to_disk``; a
directory of such data files (read in sorted order, recursively); otherwise a Hub dataset id ``name``,
``name:config`` or ``name@split`` (``name:config@split``), loaded with ``datasets.load_dataset`` and cached as
datasets caches it. Rows keep their location (file and line, or source and row) for the errors further on.

A mixture is as long as its sources together; each source supplies ``weight / sum(weights)`` of it, drawn
without replacement (whole passes plus a random remainder when a source is smaller than its share), and the
result is shuffled. Everything is drawn from one generator seeded with ``--seed``, so a mixture repeats exactly.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf_lora_ds.records import DataError, Record, load_records

__all__ = ["Source", "LoadedData", "parse_sources", "load_source", "load_data", "mix"]

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
    """Validated-to-load records in training order and, per record, the source it came from."""

    records: list[Record]
    sources: list[str]
    names: list[str]  # the sources in the order they were given

    def counts(self) -> dict[str, int]:
        """Samples per source, in the order the sources were given."""
        counter = Counter(self.sources)
        return {name: counter[name] for name in self.names}

    def summary(self) -> str:
        parts = ", ".join(f"{name}: {count}" for name, count in self.counts().items())
        return f"data: {len(self.records)} samples from {len(self.counts())} source(s) ({parts})"


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


def load_source(location: str, trust_remote_code: bool = False) -> list[Record]:
    """All records of one source, each with its location (see the module docstring for the lookup order)."""
    path = Path(location)
    if path.is_file():
        return load_records(path)
    if path.is_dir():
        return _load_directory(path)
    if path.suffix.lower() in DATA_SUFFIXES:
        raise FileNotFoundError(f"data file not found: {path} (check --train_file / --eval_file)")
    return _load_hub(location, trust_remote_code)


def _load_directory(path: Path) -> list[Record]:
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        import datasets

        dataset = datasets.load_from_disk(str(path))
        if isinstance(dataset, datasets.DatasetDict):
            if "train" not in dataset:
                raise DataError(f"{path}: a DatasetDict without a 'train' split (splits: {sorted(dataset)})")
            dataset = dataset["train"]
        return _rows(dataset, str(path))
    shards = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
    if not shards:
        raise DataError(
            f"{path}: no data files (.json, .jsonl, .parquet) in this directory, and it is not a "
            "datasets.save_to_disk directory"
        )
    return [record for shard in shards for record in load_records(shard)]


def _load_hub(location: str, trust_remote_code: bool) -> list[Record]:
    """A Hub dataset by id; with no network (HF_DATASETS_OFFLINE) only what datasets has cached resolves."""
    match = _HUB_ID.fullmatch(location)
    if not match:
        raise FileNotFoundError(f"{location}: no such file or directory, and not a Hub dataset id (name[:config][@split])")
    import datasets

    name, config, split = match["name"], match["config"], match["split"] or "train"
    # datasets >= 4 runs no dataset scripts, so only older versions take trust_remote_code.
    extra = {"trust_remote_code": True} if trust_remote_code and datasets.__version__ < "4" else {}
    try:
        dataset = datasets.load_dataset(name, config, split=split, **extra)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "cannot load this source"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"{location}: no such file or directory, and the Hub dataset {name!r} (config {config}, split {split}) "
            f"cannot be loaded: {reason}"
        ) from None
    return _rows(dataset, location)


def _rows(dataset: Any, location: str) -> list[Record]:
    return [Record(row, f"{location}, row {i}") for i, row in enumerate(dataset)]


def load_data(spec: str | Path | list[dict], seed: int = 0, trust_remote_code: bool = False) -> LoadedData:
    """Records of ``spec``: one source or several mixed by weight (``--train_file`` text), or a list of records."""
    if isinstance(spec, list):
        return LoadedData(load_records(spec), ["records"] * len(spec), ["records"])
    sources = parse_sources(str(spec))
    loaded = [(source, load_source(source.location, trust_remote_code)) for source in sources]
    if len(loaded) == 1:
        source, records = loaded[0]
        return LoadedData(records, [source.location] * len(records), [source.location])
    return mix(loaded, seed)


def mix(parts: list[tuple[Source, list[Record]]], seed: int) -> LoadedData:
    """Draw each source's share of ``sum(len(records))`` samples and shuffle them together, reproducibly."""
    total = sum(len(records) for _, records in parts)
    counts = _shares(total, [source.weight for source, _ in parts])
    rng = np.random.default_rng(seed)
    picked: list[tuple[Record, str]] = []
    for (source, records), count in zip(parts, counts):
        if not records:
            raise DataError(f"mixture source {source.location!r}: no records")
        picked += [(records[i], source.location) for i in _draw(len(records), count, rng)]
    order = rng.permutation(len(picked))
    names = [source.location for source, _ in parts]
    return LoadedData([picked[i][0] for i in order], [picked[i][1] for i in order], names)


def _shares(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` (largest remainder), so the counts add up exactly."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _draw(size: int, count: int, rng: np.random.Generator) -> list[int]:
    """``count`` indices into ``size`` records: whole shuffled passes, then a sample without replacement."""
    passes, rest = divmod(count, size)
    indices = [int(i) for _ in range(passes) for i in rng.permutation(size)]
    return indices + [int(i) for i in rng.choice(size, rest, replace=False)]
