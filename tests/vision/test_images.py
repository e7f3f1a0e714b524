"""Opening the images a conversation refers to: upright RGB pixels, the size from the header alone, and every way a
file can be wrong as one line naming the record and the file."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from hf_lora_ds.data.records import DataError
from hf_lora_ds.vision.images import image_size, load_image

WHERE = "data/train.jsonl, line 7"


def png(path, size=(4, 3), mode="RGB", color="red"):
    Image.new(mode, size, color).save(path)
    return str(path)


def rotated_jpeg(path, orientation: int = 6) -> str:
    """A 4 x 2 JPEG whose EXIF says to turn it a quarter (6: 90 degrees clockwise), as a phone writes a portrait."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.new("RGB", (4, 2), "white").save(path, format="JPEG", exif=exif.tobytes())
    return str(path)


@pytest.mark.parametrize(("mode", "color"), [("RGB", "red"), ("RGBA", (255, 0, 0, 128)), ("L", 76), ("P", 1)])
def test_a_path_loads_as_rgb(tmp_path, mode, color):
    image = load_image(png(tmp_path / "a.png", mode=mode, color=color), WHERE)
    assert image.mode == "RGB"
    assert image.size == (4, 3)


def test_a_palette_image_with_transparency_loads_without_a_warning(tmp_path, recwarn):
    image = Image.new("P", (2, 2), 0)
    image.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0])
    image.save(tmp_path / "t.png", transparency=b"\x00\x80\xff")  # per-colour alpha: PIL warns on convert("RGB")
    assert load_image(str(tmp_path / "t.png"), WHERE).mode == "RGB"
    assert not [w for w in recwarn if "Palette images with Transparency" in str(w.message)]


def test_exif_orientation_is_applied_to_the_pixels_and_the_header_size(tmp_path):
    path = rotated_jpeg(tmp_path / "portrait.jpg")
    assert load_image(path, WHERE).size == (2, 4)
    assert image_size(path, WHERE) == (2, 4)
    plain = rotated_jpeg(tmp_path / "plain.jpg", orientation=1)
    assert load_image(plain, WHERE).size == (4, 2)
    assert image_size(plain, WHERE) == (4, 2)


def test_a_bytes_dict_and_a_pil_image_in_code(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGBA", (5, 6)).save(buffer, format="PNG")
    ref = {"bytes": buffer.getvalue(), "path": "ignored/when/bytes.png"}
    assert load_image(ref, WHERE).size == (5, 6)
    assert load_image(ref, WHERE).mode == "RGB"
    assert image_size(ref, WHERE) == (5, 6)
    path_only = {"bytes": None, "path": png(tmp_path / "b.png", size=(7, 2))}
    assert image_size(path_only, WHERE) == (7, 2)
    pil = Image.new("L", (3, 8))
    assert load_image(pil, WHERE).mode == "RGB"
    assert image_size(pil, WHERE) == (3, 8)


def test_image_size_reads_the_header_only(tmp_path):
    """A file cut after its header: its size is known without decoding, its pixels are not."""
    whole = _png_bytes((40, 30))
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole[: len(whole) // 2])
    assert image_size(str(cut), WHERE) == (40, 30)
    with pytest.raises(DataError, match=rf"^{WHERE}: image {cut} cannot be decoded \("):
        load_image(str(cut), WHERE)


def _png_bytes(size) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise(size, 64).save(buffer, format="PNG")  # noise: no compression makes the data tiny
    return buffer.getvalue()


@pytest.mark.parametrize("read", [load_image, image_size])
def test_a_missing_file_is_one_line_naming_record_and_file(tmp_path, read):
    missing = str(tmp_path / "gone.png")
    with pytest.raises(DataError) as err:
        read(missing, WHERE)
    assert str(err.value) == f"{WHERE}: image file not found: {missing}"


@pytest.mark.parametrize("read", [load_image, image_size])
def test_a_file_that_is_no_image_is_one_line_naming_record_and_file(tmp_path, read):
    text = tmp_path / "notes.png"
    text.write_text("not an image\n")
    with pytest.raises(DataError) as err:
        read(str(text), WHERE)
    assert str(err.value) == f"{WHERE}: {text} is not an image file PIL can read"


def test_corrupt_bytes_name_their_size_and_file(tmp_path):
    with pytest.raises(DataError, match=rf"^{WHERE}: \(5 bytes from x.png\) is not an image file PIL can read$"):
        load_image({"bytes": b"12345", "path": "some/x.png"}, WHERE)


@pytest.mark.parametrize("ref", [7, {"bytes": None, "path": None}])
def test_what_is_no_image_reference_is_refused(ref):
    with pytest.raises(DataError, match=rf"^{WHERE}: not an image reference"):
        load_image(ref, WHERE)
