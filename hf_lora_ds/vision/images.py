"""An image a conversation refers to, opened when it is needed: ``load_image`` for its pixels, ``image_size`` for the
size a planner counts image tokens from without decoding any pixel.

A reference (``ImageRef``) is what ``hf_lora_ds.data.formats`` made of the record's image: an absolute path, a
``{"bytes", "path"}`` dict (a ``datasets.Image`` value, a ``data:`` URI decoded) or a PIL image given in code. A file
that is missing, unreadable or no image is a ``DataError`` in one line naming the record and the file, never a
traceback from deep inside PIL, and never a record silently skipped.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO

from PIL import Image, ImageOps, UnidentifiedImageError

from hf_lora_ds.data.records import DataError
from hf_lora_ds.errors import one_line

__all__ = ["ImageRef", "load_image", "image_size"]

ImageRef = str | dict[str, Any] | Image.Image
# EXIF orientations that turn the image a quarter: width and height trade places once it is upright.
_QUARTER_TURNS = frozenset({5, 6, 7, 8})
_ORIENTATION = 0x0112


def load_image(ref: ImageRef, where: str) -> Image.Image:
    """The image of ``ref`` decoded, upright (its EXIF orientation applied, as a camera meant it) and in RGB, the mode
    every image processor expects; ``where`` is the record's location, for the error."""
    if isinstance(ref, Image.Image):
        return _rgb(ImageOps.exif_transpose(ref))
    with _opened(ref, where) as image:
        try:
            image.load()  # decodes now, so a truncated file fails here, named, not in a worker of the collator
            return _rgb(ImageOps.exif_transpose(image))
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise DataError(f"{where}: image {_name(ref)} cannot be decoded ({one_line(str(err))})") from None


def image_size(ref: ImageRef, where: str) -> tuple[int, int]:
    """``(width, height)`` of the upright image, read from the file's header alone (PIL opens lazily), so a planner
    can count every image's tokens without decoding their pixels."""
    if isinstance(ref, Image.Image):
        return _upright_size(ref)
    with _opened(ref, where) as image:
        return _upright_size(image)


def _upright_size(image: Image.Image) -> tuple[int, int]:
    width, height = image.size
    return (height, width) if _orientation(image) in _QUARTER_TURNS else (width, height)


def _orientation(image: Image.Image) -> int | None:
    """The EXIF orientation the header holds. ``getexif`` would decode a PNG to look for EXIF after its pixels; the
    raw EXIF that JPEG, WebP and PNG (before the pixels) headers give is read instead, TIFF's tags as they are."""
    if (raw := image.info.get("exif")) is not None:
        exif = Image.Exif()
        exif.load(raw)
        return exif.get(_ORIENTATION)
    return image.getexif().get(_ORIENTATION) if image.format == "TIFF" else None


def _rgb(image: Image.Image) -> Image.Image:
    """RGB; a palette image with a transparent colour goes through RGBA, as PIL asks, rather than warning per image."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image if image.mode == "RGB" else image.convert("RGB")


def _opened(ref: ImageRef, where: str) -> Image.Image:
    """The image of a path or a bytes dict, opened lazily (header read, pixels not); each way it fails is one line."""
    try:
        return Image.open(_stream(ref, where))
    except FileNotFoundError:
        raise DataError(f"{where}: image file not found: {_name(ref)}") from None
    except UnidentifiedImageError:
        raise DataError(f"{where}: {_name(ref)} is not an image file PIL can read") from None
    except (OSError, Image.DecompressionBombError) as err:
        raise DataError(f"{where}: image {_name(ref)} cannot be read ({one_line(str(err))})") from None


def _stream(ref: ImageRef, where: str) -> str | BinaryIO:
    if isinstance(ref, str):
        return ref
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return io.BytesIO(ref["bytes"])
        if ref.get("path") is not None:
            return str(ref["path"])
    raise DataError(f"{where}: not an image reference: {type(ref).__name__} ({ref!r:.60})")


def _name(ref: ImageRef) -> str:
    """How an error names the image: its path, or the bytes it came as (with the file name they were read from)."""
    if isinstance(ref, dict):
        if ref.get("bytes") is None:
            return str(ref.get("path"))
        path = ref.get("path")
        return f"({len(ref['bytes'])} bytes{f' from {Path(path).name}' if path else ''})"
    return str(ref)
