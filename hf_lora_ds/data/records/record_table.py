"""Records as a memory-mapped Arrow table, so a file of a million records is never a million Python objects.

Each record is one row of three string columns: ``record`` (its JSON text, decoded only where it is validated),
``where`` (its location: file and line, or source and row, for every error and audit further on) and ``source``
(the ``--train_file`` entry it came from). JSON text rather than nested columns, because records of one file may
have different fields (alpaca next to ShareGPT) and tool schemas differ from record to record: Arrow's schema
inference would unify or reject them, and its JSON reader names no line for a malformed one.

Binary values of rows given in code or read from a dataset (an image's bytes, a ``datasets.Image`` column, a PIL image)
are written as ``data:`` URIs (``json_value``), which ``hf_lora_ds.data.formats`` reads as the image they were, rather
than as the text of their ``repr``.

A file is read once, line by line (``hf_lora_ds.data.records.iter_record_texts``), and written to the cache
(``cache_root``) under a fingerprint of its path, size and modification time: a second run with the same file
reads the table from the cache, and a changed file is read again.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, overload

import datasets
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import Hasher

from hf_lora_ds.data.records import Record, decode_record, iter_record_texts

__all__ = ["COLUMNS", "RecordTable", "cache_root", "read_file", "from_rows", "from_list", "json_value"]

COLUMNS = datasets.Features(
    {"record": datasets.Value("string"), "where": datasets.Value("string"), "source": datasets.Value("string")}
)
_FORMAT = 2  # bump when the rows written for the same file change, so old cached tables are not reused
_BATCH = 10_000  # rows written at a time: a few MB of text


def cache_root(cache_dir: str | Path | None) -> Path:
    """Where record tables and tokenized samples are cached: ``--dataset_cache_dir``, else datasets' own cache
    (``HF_DATASETS_CACHE``), so runs on the same data share it as they share downloaded datasets."""
    root = Path(cache_dir or os.path.join(datasets.config.HF_DATASETS_CACHE, "hf_lora_ds"))
    root.mkdir(parents=True, exist_ok=True)
    return root


class RecordTable(Sequence[Record]):
    """A list-like view of a record table that decodes rows on access, for callers that want Python records
    (eval sets, tests) without the whole table being converted."""

    def __init__(self, table: datasets.Dataset):
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        row = self.table[index]
        return Record(decode_record(row["record"], row["where"]), row["where"])

    def __iter__(self) -> Iterator[Record]:
        for row in self.table:
            yield Record(decode_record(row["record"], row["where"]), row["where"])


def read_file(path: Path, source: str, cache_dir: str | Path | None = None) -> datasets.Dataset:
    """The records of a ``.json``/``.jsonl``/``.parquet`` file as a table, read in bounded memory or from the cache.

    The rows are written ``_BATCH`` at a time (datasets' generator builder would encode them one by one, at ten
    times the cost of reading them), to a file named by the fingerprint and moved into place only when complete.
    """
    stat = path.stat()
    fingerprint = Hasher.hash([str(path.resolve()), stat.st_size, stat.st_mtime_ns, str(path), source, _FORMAT])
    table = cache_root(cache_dir) / "records" / f"records-{fingerprint}.arrow"
    if not table.is_file():
        _write_rows(path, source, table)
    return datasets.Dataset.from_file(str(table))


def _write_rows(path: Path, source: str, table: Path) -> None:
    """Write the file's records to ``table``; an error in the file (not UTF-8, a broken JSON array, an unreadable
    parquet file) is the ``DataError`` that names it, and leaves no table behind."""
    table.parent.mkdir(parents=True, exist_ok=True)
    partial = table.with_name(f"{table.name}.{os.getpid()}.partial")
    try:
        with ArrowWriter(features=COLUMNS, path=str(partial)) as writer:
            texts = iter_record_texts(path)
            while rows := list(islice(texts, _BATCH)):
                records, wheres = zip(*rows)
                writer.write_batch({"record": list(records), "where": list(wheres), "source": [source] * len(rows)})
            writer.finalize()
        partial.replace(table)
    finally:
        partial.unlink(missing_ok=True)


def from_rows(dataset: datasets.Dataset, location: str, cache_dir: str | Path | None = None) -> datasets.Dataset:
    """A ``save_to_disk`` or Hub dataset's rows as a record table, located by row; a null column is left out of
    the row's JSON only later, by ``hf_lora_ds.data.formats``, as a field that is absent."""
    dataset = _undecoded(dataset.with_format(None))
    fingerprint = Hasher.hash([dataset._fingerprint, location, _FORMAT])
    return dataset.map(
        _RowsToRecords(location),
        batched=True,
        with_indices=True,
        remove_columns=dataset.column_names,
        features=COLUMNS,
        new_fingerprint=fingerprint,
        cache_file_name=str(cache_root(cache_dir) / f"rows-{fingerprint}.arrow"),
        desc=f"Reading {location}",
    )


class _RowsToRecords:
    """Batched ``map`` function: columns of rows to the record table's columns (a class, so it pickles)."""

    def __init__(self, location: str):
        self.location = location

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[str]]:
        names = list(batch)
        rows = (dict(zip(names, values)) for values in zip(*batch.values()))
        return {
            "record": [json.dumps(row, ensure_ascii=False, default=json_value) for row in rows],
            "where": [f"{self.location}, row {i}" for i in indices],
            "source": [self.location] * len(indices),
        }


def from_list(records: list[Any], source: str = "records") -> datasets.Dataset:
    """Records given as Python objects (a notebook, a test, a benchmark), located as ``record i``."""
    return datasets.Dataset.from_dict(
        {
            "record": [json.dumps(record, ensure_ascii=False, default=json_value) for record in records],
            "where": [f"record {i}" for i in range(len(records))],
            "source": [source] * len(records),
        },
        features=COLUMNS,
    )


def json_value(value: Any) -> Any:
    """What JSON cannot hold, as JSON: bytes and PIL images as ``data:`` URIs (a PIL image as PNG, lossless), anything
    else (a timestamp) as its text."""
    if isinstance(value, bytes | bytearray):
        return "data:application/octet-stream;base64," + base64.b64encode(value).decode("ascii")
    if hasattr(value, "save") and hasattr(value, "getexif"):  # a PIL image, named so without importing PIL
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return str(value)


def _undecoded(dataset: datasets.Dataset) -> datasets.Dataset:
    """``dataset`` with its image columns read as ``{"bytes", "path"}`` rather than decoded to PIL images: the bytes
    travel as they are stored, and are decoded once, by the collator."""
    features = _image_features_undecoded(dataset.features)
    return dataset if features == dataset.features else dataset.cast(features)


def _image_features_undecoded(feature: Any) -> Any:
    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(feature, dict):  # Features, and a struct's fields
        return type(feature)({name: _image_features_undecoded(inner) for name, inner in feature.items()})
    if isinstance(feature, list):  # datasets' list of one feature
        return [_image_features_undecoded(inner) for inner in feature]
    if isinstance(feature, datasets.Sequence | getattr(datasets, "List", datasets.Sequence)):
        inner = _image_features_undecoded(feature.feature)
        return feature if inner is feature.feature else type(feature)(inner, length=feature.length)
    return feature
