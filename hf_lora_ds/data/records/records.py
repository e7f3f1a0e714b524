"""Load SFT records and check them before anything is tokenized or trained.

A bad record found deep inside Trainer costs a user a GPU allocation and a traceback that names no line.
Every error raised here names the file, the line (or row / record index) and the field, and says what to fix.

This module reads files; what a record must hold, and the one message for each way it can be wrong, is
``hf_lora_ds.data.formats``.

Files are read one record at a time (``iter_record_texts``): training data goes from there into a memory-mapped
Arrow table (``hf_lora_ds.data.records.record_table``) and is validated there in parallel, so a large file is never held
whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hf_lora_ds.errors import MissingPathError, UserError, one_line

__all__ = [
    "DataError",
    "Record",
    "load_records",
    "iter_record_texts",
    "decode_record",
    "data_file",
]

_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20  # bytes a JSON array file is read by
_MAX_RECORD = 1 << 28  # characters of one JSON array record before it is called malformed
_PLACES = (", line ", ", row ")  # how a location names the record's place after its file (see iter_record_texts)


class DataError(UserError):
    """A record that cannot be trained on; the message names where it is and what to change."""


@dataclass(frozen=True)
class Record:
    """One raw record and where it came from, so later errors can still point at the line."""

    data: Any
    where: str


def load_records(data: str | Path | list[dict]) -> list[Record]:
    """Read records from a ``.json`` (array, JSON lines or one object), ``.jsonl`` or ``.parquet`` file, or take a
    list.

    For the small files held whole (eval sets); training data is read into Arrow by
    ``hf_lora_ds.data.records.record_table``.
    """
    if isinstance(data, list):
        return [Record(item, f"record {i}") for i, item in enumerate(data)]
    return [Record(decode_record(text, where), where) for text, where in iter_record_texts(data)]


def iter_record_texts(data: str | Path) -> Iterator[tuple[str, str]]:
    """``(JSON text, location)`` of each record of a file, one at a time, in file order.

    Each is read in bounded memory: JSON lines a line at a time, parquet a batch of rows, a ``.json`` array a
    chunk of text at a time. The JSON text of a line is not decoded here:
    ``decode_record`` does that where the record is validated (in parallel, for training data).
    """
    path = Path(data)
    if not path.is_file():
        raise MissingPathError(f"data file not found: {path} (check --train_file / --eval_file)")
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl", ".parquet"):
        raise DataError(f"{path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")
    if suffix == ".parquet":
        texts = _parquet_texts(path)
    elif _starts_with_bracket(path):
        texts = _json_array_texts(path)
    elif suffix == ".json" and not _first_line_is_json(path):
        texts = _one_object_text(path)
    else:
        texts = _json_line_texts(path)
    empty = True
    for item in texts:
        empty = False
        yield item
    if empty:
        raise DataError(f"{path}: no records found")


def decode_record(text: str, where: str) -> Any:
    """One record's JSON text as Python data; malformed JSON is reported at the record's location."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None


def data_file(where: str) -> Path | None:
    """The data file a record's location names (``data/chat.jsonl, line 3``, ``shard.parquet, row 7``), read back
    from the location this module wrote, so what refers to files beside the data (images) is found there; None for
    records given in code, a saved dataset's or a Hub dataset's rows."""
    for place in _PLACES:
        head, sep, _ = where.rpartition(place)
        if sep:
            return _existing_file(head)
    return None


@lru_cache(maxsize=64)
def _existing_file(path: str) -> Path | None:
    """``path`` if it is a file (a saved dataset's folder is not), asked once per file, not once per record."""
    return Path(path) if Path(path).is_file() else None


def _parquet_texts(path: Path) -> Iterator[tuple[str, str]]:
    """Rows of a parquet file, a batch at a time, as JSON text (values JSON cannot hold, such as timestamps, as
    their text); a file pyarrow cannot read (truncated, not parquet) is named rather than left to
    ``ArrowInvalid: Parquet magic bytes not found``, which does not say which file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1000)
        row = 0
        for batch in batches:
            for values in batch.to_pylist():
                yield json.dumps(values, ensure_ascii=False, default=str), f"{path}, row {row}"
                row += 1
    except (pa.ArrowException, OSError) as err:
        raise DataError(
            f"{path}: not a readable parquet file ({one_line(str(err))}); re-export it, or use .json / .jsonl"
        ) from None


def _starts_with_bracket(path: Path) -> bool:
    """Whether a ``.json``/``.jsonl`` file holds one JSON array (rather than JSON lines)."""
    with path.open("rb") as f:
        while chunk := f.read(4096):
            text = chunk.removeprefix(_BOM).lstrip()
            if text:
                return text.startswith(b"[")
    return False


def _first_line_is_json(path: Path) -> bool:
    """Whether a ``.json`` file's first non-blank line is a JSON value of its own: JSON lines, else one object
    written over several lines (axolotl's fixtures), read whole."""
    for line, _ in _json_line_texts(path):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            return False
        return True
    return True


def _one_object_text(path: Path) -> Iterator[tuple[str, str]]:
    """The one JSON value a ``.json`` file holds, as one record; a malformed file is reported with what Python's
    parser says about the whole of it (its line and column)."""
    text = "".join(_utf8_chunks(path))
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}, line {err.lineno}: malformed JSON (read whole, as one object, since its first line is no JSON "
            f"value of its own; Python's json parser: {err})"
        ) from None
    yield text, f"{path}, line 1 (the file's one object)"


def _not_utf8(path: Path, line: int, offset: int, byte: int) -> DataError:
    return DataError(
        f"{path}, line {line} (byte offset {offset}): not UTF-8 text (byte 0x{byte:02x}); "
        "re-save the file as UTF-8 (e.g. iconv -f <its encoding> -t utf-8)"
    )


def _json_line_texts(path: Path) -> Iterator[tuple[str, str]]:
    """Non-blank lines and their numbers, read a line at a time; lines end at ``\\n`` only, as in JSON lines."""
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            start = 3 if number == 1 and raw.startswith(_BOM) else 0  # a byte-order mark is not part of the JSON
            try:
                line = raw[start:].decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, number, offset + start + err.start, raw[start + err.start]) from None
            offset += len(raw)
            if line.strip():  # without its line ending, so a JSON error's column is on this line
                yield line.rstrip("\r\n"), f"{path}, line {number}"


def _utf8_chunks(path: Path) -> Iterator[str]:
    """The file's text, ``_CHUNK`` bytes at a time (a character cut by a chunk's end is finished by the next); bytes
    that are not UTF-8 are reported with their offset and line, which Python's ``UnicodeDecodeError`` leaves out
    together with the file name."""
    offset = lines = 0  # bytes and newlines before ``data``
    pending = b""
    with path.open("rb") as f:
        while (raw := f.read(_CHUNK)) or pending:
            data = pending + raw
            if offset == 0 and data.startswith(_BOM):  # a byte-order mark is not part of the JSON
                data, offset = data[3:], 3
            try:
                text, pending = data.decode("utf-8"), b""
            except UnicodeDecodeError as err:
                if not (raw and err.reason == "unexpected end of data"):
                    where = lines + data.count(b"\n", 0, err.start) + 1
                    raise _not_utf8(path, where, offset + err.start, data[err.start]) from None
                text, pending = data[: err.start].decode("utf-8"), data[err.start :]
            used = len(data) - len(pending)
            offset, lines = offset + used, lines + data.count(b"\n", 0, used)
            yield text


class _TextWindow:
    """The part of a file's text the JSON array reader is at: read ahead a chunk at a time, the text before the
    current record dropped, so memory holds a record and a chunk however large the file. The window starts at a
    line start, so a JSON error's line and column map back onto the file."""

    def __init__(self, path: Path):
        self.chunks = _utf8_chunks(path)
        self.text = ""
        self.at_end = False
        self.first_line = 1  # the file's line number of the window's first line
        self.counted_line, self.counted_to = 1, 0  # line_of's progress: the line number at ``counted_to``

    def read_more(self, keep_from: int) -> int:
        """Append the next chunk, first dropping the lines before the one holding ``keep_from``; returns how many
        characters were dropped, by which every position into the window moves back."""
        chunk = next(self.chunks, None)
        if chunk is None:
            self.at_end = True
            return 0
        cut = self.text.rfind("\n", 0, keep_from) + 1
        self.first_line = self.counted_line = self.line_of(cut)
        self.counted_to = 0
        self.text = self.text[cut:] + chunk
        return cut

    def line_of(self, pos: int) -> int:
        """The file's line number at ``pos``; positions are asked in increasing order, so counting is linear."""
        self.counted_line += self.text.count("\n", self.counted_to, pos)
        self.counted_to = pos
        return self.counted_line

    def skip_space(self, pos: int) -> int:
        """The position of the next non-blank character, reading on as needed; ``len(text)`` at the file's end."""
        while True:
            while pos < len(self.text) and self.text[pos].isspace():
                pos += 1
            if pos < len(self.text) or self.at_end:
                return pos
            pos -= self.read_more(pos)


def _json_array_texts(path: Path) -> Iterator[tuple[str, str]]:
    """Decode a JSON array element by element, reading the file a chunk at a time, so each record keeps the line
    it starts on and a file of millions of records is never held whole."""
    window = _TextWindow(path)
    decoder = json.JSONDecoder()
    count = 0
    pos = window.skip_space(0) + 1  # past the '[' that _starts_with_bracket saw
    while True:
        pos = window.skip_space(pos)
        if pos == len(window.text):
            raise DataError(f"{path}, line {window.line_of(pos)}: malformed JSON (the array has no closing ']')")
        if window.text[pos] == "]":
            return
        if count:
            if window.text[pos] != ",":
                raise DataError(f"{path}, line {window.line_of(pos)}: malformed JSON (expected ',' or ']')")
            pos = window.skip_space(pos + 1)
        pos, end = _decode_next(window, decoder, pos, path)
        yield window.text[pos:end], f"{path}, line {window.line_of(pos)} (record {count})"
        count += 1
        pos = end


def _decode_next(window: _TextWindow, decoder: json.JSONDecoder, pos: int, path: Path) -> tuple[int, int]:
    """Where the JSON value at ``pos`` starts and ends, once the window holds all of it.

    A value cut by the window's end fails to decode like a malformed one, so the window doubles what it holds of
    the value (keeping re-decoding linear) until it decodes; a malformed value is reported once the file has
    ended, or ``_MAX_RECORD`` characters past its start, so a bad record early in a huge file is not read to the end.
    """
    while True:
        try:
            return pos, decoder.raw_decode(window.text, pos)[1]
        except json.JSONDecodeError as err:
            held = len(window.text) - pos
            if window.at_end or held > _MAX_RECORD:
                line = window.first_line + err.lineno - 1
                raise DataError(f"{path}, line {line}: malformed JSON ({err.msg} at column {err.colno})") from None
        while not window.at_end and len(window.text) - pos < 2 * held + 1:
            pos -= window.read_more(pos)
