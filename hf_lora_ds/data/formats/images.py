"""The images of a conversation, whatever shape the record gave them in, as one list in the order they stand.

Every shape ends the same way: each message's text holds ``IMAGE_MARK`` where an image stands, and the conversation's
``images`` holds the images in mark order, each an ``ImageRef`` (``hf_lora_ds.vision.images``). A mark comes from an
image part (``hf_lora_ds.data.records.content_parts``), which may hold its image, or from a placeholder written in the
text (LLaVA, ms-swift, LLaMA-Factory); a mark with no image of its own takes the next of the record's ``images`` column
(TRL's data-less ``{"type": "image"}`` parts too). Their counts must agree, as LLaMA-Factory requires, except that a
record whose text has no mark at all gets its images at the start of its first user turn, as TRL and ms-swift place
them. Paths are found relative to the data file's folder (``FormatOptions.image_dir`` overrides it); a URL is refused,
since no network is reached from here.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from hf_lora_ds.data.records import DataError, data_file
from hf_lora_ds.data.records.content_parts import IMAGE_MARK, PARTS_KEY

if TYPE_CHECKING:
    from hf_lora_ds.data.formats.turns import Reading

__all__ = ["place_images", "image_ref"]

Slot = tuple[Any, str]  # what stands at a mark (None: the column's next image) and the field it came from


def place_images(messages: list[dict[str, Any]], record: dict, reading: Reading) -> list[Any]:
    """The conversation's images in mark order, each resolved (``image_ref``); ``messages`` gain the marks of a
    record whose images had none. Counts that differ are refused naming both."""
    column = _column(record, reading)
    slots = [slot for i, message in enumerate(messages) for slot in _slots(message, i, reading)]
    if not slots and column:
        slots = _mark_first_user_turn(messages, len(column), reading)
    free = [k for k, (value, _) in enumerate(slots) if value is None]
    if len(free) != len(column):
        raise DataError(f"{reading.where}: {_mismatch(len(free), len(column), len(slots), reading)}")
    for k, image in zip(free, column):
        slots[k] = image
    return [image_ref(value, reading.where, label, _base_dir(reading)) for value, label in slots]


def image_ref(value: Any, where: str, label: str, base_dir: Path | None = None) -> Any:
    """One image as the trainer opens it: an absolute path (relative ones found under ``base_dir``, else the working
    directory), a ``{"bytes", "path"}`` dict (a ``datasets.Image`` value, a ``data:`` URI) or a PIL image given in
    code. A URL, a missing file or a value that is no image is refused, naming ``label``."""
    if isinstance(value, str):
        return _from_text(value, where, label, base_dir)
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value), "path": None}
    if isinstance(value, dict) and value.keys() <= {"bytes", "path"}:
        return _from_dict(value, where, label, base_dir)
    if _is_pil(value):
        return value
    raise DataError(
        f"{where}: field '{label}' must be an image path, URL or data URI, a {{bytes, path}} object or a PIL image, "
        f"got {type(value).__name__} ({value!r:.60})"
    )


def _column(record: dict, reading: Reading) -> list[Slot]:
    """The record's ``images`` (a list, or one image alone as ms-swift allows), each with its field name."""
    images, name = record.get("images"), reading.names["images"]
    if images is None:
        return []
    if not isinstance(images, list):
        return [(images, name)]
    return [(image, f"{name}[{k}]") for k, image in enumerate(images)]


def _slots(message: dict[str, Any], index: int, reading: Reading) -> list[Slot]:
    """One slot per mark of the message's text: its parts' (``Reading.image_parts``), else the placeholders'."""
    content = message.get("content") or ""
    marks = content.count(IMAGE_MARK)
    parts = reading.image_parts.get(index)
    if parts is None:
        return [(None, f"message {index}")] * marks
    if len(parts) != marks:  # a placeholder cut in two by the parts' boundary, e.g. "<ima" + "ge>"
        raise DataError(f"{reading.where}: message {index}: its parts write {IMAGE_MARK} across a part boundary")
    return list(parts)


def _mark_first_user_turn(messages: list[dict[str, Any]], count: int, reading: Reading) -> list[Slot]:
    """A record with images and no mark: its images open its first user turn (TRL's and ms-swift's rule)."""
    index = next((i for i, message in enumerate(messages) if message["role"] == "user"), None)
    if index is None:
        raise DataError(
            f"{reading.where}: field '{reading.names['images']}': {count} image(s), no {IMAGE_MARK} placeholder and "
            f"no user turn to put them in; write {IMAGE_MARK} where each image stands"
        )
    message = messages[index]
    message["content"] = IMAGE_MARK * count + message["content"]
    if PARTS_KEY in message:
        message[PARTS_KEY] = [{"type": "image"}] * count + message[PARTS_KEY]
    reading.move_spans(index, len(IMAGE_MARK) * count)
    return [(None, f"message {index}")] * count


def _mismatch(marks: int, images: int, slots: int, reading: Reading) -> str:
    name = reading.names["images"]
    held = f"{slots} image place(s) ({IMAGE_MARK} placeholders and image parts)"
    if slots != marks:
        held += f", {marks} of them without an image of their own"
    return (
        f"field '{name}' holds {images} image(s) for {held}; give one image per {IMAGE_MARK} placeholder or "
        "data-less image part, in order"
    )


def _from_text(value: str, where: str, label: str, base_dir: Path | None) -> Any:
    scheme = value[: value.find(":")].lower() if ":" in value[:12] else ""
    if scheme == "data":
        return {"bytes": _data_uri(value, where, label), "path": None}
    if scheme in ("http", "https"):
        raise DataError(
            f"{where}: field '{label}': image URL {value!r:.200} is not fetched (no network is reached from here); "
            "download the image and give its path"
        )
    if scheme == "file":
        return _local(Path(unquote(urlparse(value).path)), where, label, None)
    if not value.strip():
        raise DataError(f"{where}: field '{label}': an empty image path")
    return _local(Path(value).expanduser(), where, label, base_dir)


def _data_uri(value: str, where: str, label: str) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URI (the only data URI an image is written as)."""
    header, comma, payload = value.partition(",")
    if not comma or not header.endswith(";base64"):
        raise DataError(f"{where}: field '{label}': a data URI must be data:image/...;base64,<data> ({value!r:.60})")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as err:
        raise DataError(f"{where}: field '{label}': the data URI is not valid base64 ({err})") from None


def _from_dict(value: dict, where: str, label: str, base_dir: Path | None) -> Any:
    """A ``datasets.Image`` value: its bytes when it has them (a ``data:`` URI once written to the record table,
    ``hf_lora_ds.data.records.record_table``), else its path."""
    data, path = value.get("bytes"), value.get("path")
    if isinstance(data, str):
        data = _data_uri(data, where, f"{label}.bytes")
    if isinstance(data, bytes | bytearray):
        return {"bytes": bytes(data), "path": path}
    if data is not None:
        raise DataError(f"{where}: field '{label}.bytes' must be bytes, got {type(data).__name__}")
    if not isinstance(path, str):
        raise DataError(f"{where}: field '{label}': an image object with neither 'bytes' nor a 'path'")
    return _from_text(path, where, f"{label}.path", base_dir)


def _local(path: Path, where: str, label: str, base_dir: Path | None) -> str:
    """The absolute path of a local image: relative to ``base_dir`` (the data file's folder), else to the working
    directory, as LLaMA-Factory falls back from its ``media_dir``; a file found in neither is refused now, before any
    record is tokenized, rather than when a batch first opens it."""
    candidates = [path] if path.is_absolute() or base_dir is None else [base_dir / path, path]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    looked = " or ".join(str(candidate.absolute()) for candidate in candidates)
    raise DataError(f"{where}: field '{label}': image file not found: {looked}")


def _base_dir(reading: Reading) -> Path | None:
    """Where relative image paths are found: ``--image_dir`` if given, else the folder of the record's data file
    (None for records given in code or a dataset's rows: the working directory)."""
    if reading.options.image_dir is not None:
        return Path(reading.options.image_dir)
    found = data_file(reading.where)
    return found.parent if found is not None else None


@lru_cache(maxsize=1)
def _pil_image_class() -> type | None:
    try:
        from PIL import Image
    except ImportError:  # no PIL, so no PIL image can have been given
        return None
    return Image.Image


def _is_pil(value: Any) -> bool:
    cls = _pil_image_class()
    return cls is not None and isinstance(value, cls)
