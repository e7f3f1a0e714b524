"""Records with images, in every shape users have them, as one conversation: ``<image>`` marks in the messages' text
and ``conversation["images"]`` in mark order; counts checked, paths found beside the data file, URLs refused offline,
and a text-only model still refusing any image in one line."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from hf_lora_ds.data.formats import FormatOptions, to_conversation
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.content_parts import IMAGE_MARK, PARTS_KEY

ANSWER = {"role": "assistant", "content": "A cat."}


@pytest.fixture
def data_dir(tmp_path):
    """A data file's folder with two tiny images beside it, and the location of line 1 of that file."""
    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (4, 3), "red").save(tmp_path / "cat.png")
    Image.new("RGB", (2, 2), "blue").save(tmp_path / "imgs" / "dog.png")
    (tmp_path / "train.jsonl").write_text("{}\n")
    return tmp_path


def where(folder) -> str:
    return f"{folder / 'train.jsonl'}, line 1"


def convert(record, folder, **options):
    return to_conversation(record, where(folder), images=True, options=FormatOptions(**options))


def png_bytes(color: str = "green") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), color).save(buffer, format="PNG")
    return buffer.getvalue()


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image", "image": "cat.png"},  # TRL / Hugging Face
        {"type": "image", "path": "cat.png"},  # Hugging Face processors' chat templates
        {"type": "image", "url": "cat.png"},
        {"type": "image_url", "image_url": {"url": "cat.png"}},  # OpenAI chat
        {"type": "image_url", "image_url": "cat.png"},  # OpenAI's string form
        {"type": "image", "image": "cat.png", "text": None, "url": None},  # Arrow: every part has every key
    ],
)
def test_an_image_part_becomes_a_mark_where_it_stands_and_its_path_resolved_beside_the_data(data_dir, part):
    record = {"messages": [user({"type": "text", "text": "What is "}, part, {"type": "text", "text": "?"}), ANSWER]}
    conversation = convert(record, data_dir)
    assert conversation["messages"][0]["content"] == f"What is {IMAGE_MARK}?"
    assert conversation["images"] == [str((data_dir / "cat.png").resolve())]
    assert conversation["messages"][0][PARTS_KEY] == [
        {"type": "text", "text": "What is "},
        {"type": "image"},
        {"type": "text", "text": "?"},
    ]
    assert conversation["unused"] == []


def test_several_images_keep_their_order_across_turns_and_subfolders(data_dir):
    record = {
        "messages": [
            user({"type": "image", "image": "imgs/dog.png"}, {"type": "text", "text": "and"}),
            {"role": "assistant", "content": "A dog."},
            user({"type": "text", "text": "this?"}, {"type": "image", "image": "cat.png"}),
            ANSWER,
        ]
    }
    conversation = convert(record, data_dir)
    assert [m["content"] for m in conversation["messages"]] == ["<image>and", "A dog.", "this?<image>", "A cat."]
    assert conversation["images"] == [str(data_dir / "imgs" / "dog.png"), str(data_dir / "cat.png")]


def test_file_uri_and_absolute_path(data_dir):
    absolute = str(data_dir / "cat.png")
    record = {
        "messages": [
            user(
                {"type": "image_url", "image_url": {"url": (data_dir / "imgs" / "dog.png").as_uri()}},
                {"type": "image", "image": absolute},
            ),
            ANSWER,
        ]
    }
    assert convert(record, data_dir)["images"] == [str(data_dir / "imgs" / "dog.png"), absolute]


def test_a_base64_data_uri_is_decoded_to_its_bytes(data_dir):
    data = png_bytes()
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    record = {"messages": [user({"type": "image_url", "image_url": {"url": uri}}), ANSWER]}
    assert convert(record, data_dir)["images"] == [{"bytes": data, "path": None}]


def test_a_broken_data_uri_is_refused_naming_the_part(data_dir):
    record = {"messages": [user({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}), ANSWER]}
    with pytest.raises(
        DataError, match=r"line 1: field 'messages\[0\].content\[0\]': the data URI is not valid base64"
    ):
        convert(record, data_dir)


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "HTTP://example.com/a%20b.jpg"])
def test_a_url_is_refused_offline_in_one_line_naming_the_record_and_the_url(data_dir, url):
    record = {"messages": [user({"type": "image_url", "image_url": {"url": url}}), ANSWER]}
    with pytest.raises(DataError) as err:
        convert(record, data_dir)
    message = str(err.value)
    assert message.startswith(f"{where(data_dir)}: field 'messages[0].content[0]': image URL '{url}' is not fetched")
    assert "\n" not in message


def test_llava_placeholders_take_the_images_column_in_order(data_dir):
    record = {
        "messages": [
            {"role": "user", "content": "<image>Compare with <image>."},
            ANSWER,
        ],
        "images": ["imgs/dog.png", "cat.png"],
    }
    conversation = convert(record, data_dir)
    assert conversation["messages"][0]["content"] == "<image>Compare with <image>."
    assert conversation["images"] == [str(data_dir / "imgs" / "dog.png"), str(data_dir / "cat.png")]
    assert conversation["unused"] == []


def test_llamafactory_sharegpt_and_alpaca_with_images(data_dir):
    sharegpt = {
        "conversations": [{"from": "human", "value": "<image>What?"}, {"from": "gpt", "value": "A cat."}],
        "system": "Be brief.",
        "images": ["cat.png"],
    }
    conversation = convert(sharegpt, data_dir)
    assert conversation["messages"][1]["content"] == "<image>What?"
    assert conversation["images"] == [str(data_dir / "cat.png")]
    alpaca = {"instruction": "<image>Name it.", "output": "Cat.", "images": ["cat.png"]}
    assert convert(alpaca, data_dir)["images"] == [str(data_dir / "cat.png")]


def test_ms_swift_single_image_string_and_no_placeholder_opens_the_first_user_turn(data_dir):
    """ms-swift and TRL put images a record does not place at the start of its first user turn."""
    record = {
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "What?"}, ANSWER],
        "images": "cat.png",
    }
    conversation = convert(record, data_dir)
    assert [m["content"] for m in conversation["messages"]] == ["sys", "<image>What?", "A cat."]
    assert conversation["images"] == [str(data_dir / "cat.png")]


def test_unplaced_images_move_the_train_detail_of_the_turn_they_open(data_dir):
    record = {
        "messages": [
            {"role": "user", "content": "ab", "train_detail": [{"begin_offset": 1, "end_offset": 1, "train": True}]},
            ANSWER,
        ],
        "images": ["cat.png", "cat.png"],
    }
    conversation = convert(record, data_dir)
    begin = 2 * len(IMAGE_MARK) + 1
    assert conversation["messages"][0]["content"][begin] == "b"
    assert conversation["detail"] == {0: [(begin, begin + 1, True)]}


def test_trl_messages_with_data_less_image_parts_and_an_images_column(data_dir):
    record = {
        "messages": [
            user({"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}),
            ANSWER,
        ],
        "images": ["cat.png", {"bytes": png_bytes(), "path": "g.png"}],
    }
    conversation = convert(record, data_dir)
    assert conversation["messages"][0]["content"] == "<image>and<image>"
    assert conversation["images"] == [str(data_dir / "cat.png"), {"bytes": png_bytes(), "path": "g.png"}]


def test_trl_conversational_prompt_completion_with_images(data_dir):
    record = {
        "prompt": [user({"type": "image"}, {"type": "text", "text": "What?"})],
        "completion": [ANSWER],
        "images": ["cat.png"],
    }
    conversation = convert(record, data_dir)
    assert conversation["messages"][0]["content"] == "<image>What?"
    assert conversation["images"] == [str(data_dir / "cat.png")]


def test_parts_with_their_own_image_and_data_less_parts_mix_in_mark_order(data_dir):
    record = {
        "messages": [
            user({"type": "image"}, {"type": "image", "image": "cat.png"}, {"type": "text", "text": "x <image>"}),
            ANSWER,
        ],
        "images": ["imgs/dog.png", "imgs/dog.png"],
    }
    dog, cat = str(data_dir / "imgs" / "dog.png"), str(data_dir / "cat.png")
    assert convert(record, data_dir)["images"] == [dog, cat, dog]


def test_datasets_image_values_bytes_or_path_and_pil_images_in_code(data_dir):
    data, pil = png_bytes("red"), Image.new("RGB", (3, 3))
    record = {
        "messages": [{"role": "user", "content": "<image><image><image><image>"}, ANSWER],
        "images": [
            {"bytes": data, "path": None},
            {"bytes": None, "path": "cat.png"},
            pil,
            {"bytes": "data:application/octet-stream;base64," + base64.b64encode(data).decode(), "path": "x.png"},
        ],
    }
    images = convert(record, data_dir)["images"]
    assert images == [{"bytes": data, "path": None}, str(data_dir / "cat.png"), pil, {"bytes": data, "path": "x.png"}]
    assert images[2] is pil


def test_records_given_in_code_resolve_relative_paths_from_the_working_directory(data_dir, monkeypatch):
    monkeypatch.chdir(data_dir)
    record = {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": ["cat.png"]}
    assert to_conversation(record, "record 0", images=True)["images"] == [str(data_dir / "cat.png")]


def test_image_dir_overrides_the_data_files_folder(data_dir):
    record = {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": ["dog.png"]}
    images = convert(record, data_dir, image_dir=str(data_dir / "imgs"))["images"]
    assert images == [str(data_dir / "imgs" / "dog.png")]


def test_text_only_records_mix_with_image_records(data_dir):
    lines = [
        {"messages": [{"role": "user", "content": "Hi"}, ANSWER]},
        {"instruction": "Say hi", "output": "hi"},
        {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": ["cat.png"]},
        {"messages": [{"role": "user", "content": "Hi"}, ANSWER], "images": []},
    ]
    assert [len(convert(record, data_dir)["images"]) for record in lines] == [0, 0, 1, 0]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"messages": [{"role": "user", "content": "<image><image>?"}, ANSWER], "images": ["cat.png"]},
            r"field 'images' holds 1 image\(s\) for 2 image place\(s\)",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>?"}, ANSWER]},
            r"field 'images' holds 0 image\(s\) for 1 image place\(s\)",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": ["cat.png", "cat.png"]},
            r"field 'images' holds 2 image\(s\) for 1 image place\(s\)",
        ),
        (
            {"messages": [user({"type": "image", "image": "cat.png"}), ANSWER], "images": ["cat.png"]},
            r"holds 1 image\(s\) for 1 image place\(s\) \(<image> placeholders and image parts\), 0 of them without",
        ),
        (
            {"messages": [ANSWER], "images": ["cat.png"]},
            r"field 'images': 1 image\(s\), no <image> placeholder and no user turn",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": ["missing.png"]},
            r"field 'images\[0\]': image file not found: .*missing.png or .*missing.png$",
        ),
        (
            {"messages": [user({"type": "image", "image": "no/such.jpg"}), ANSWER]},
            r"field 'messages\[0\].content\[0\]': image file not found: .*no/such.jpg",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": [7]},
            r"field 'images\[0\]' must be an image path, URL or data URI, a \{bytes, path\} object or a PIL image, "
            r"got int",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": [{"bytes": None, "path": None}]},
            r"field 'images\[0\]': an image object with neither 'bytes' nor a 'path'",
        ),
        (
            {"messages": [user({"type": "image_url"}), ANSWER]},
            r"field 'messages\[0\].content\[0\]': an 'image_url' part needs 'image_url'",
        ),
        (
            {"messages": [user({"type": "image", "image": "cat.png", "train": True}), ANSWER]},
            r"field 'messages\[0\].content\[0\]': a training flag on a 'image' part",
        ),
        (
            {"messages": [user({"type": "text", "text": "<ima"}, {"type": "text", "text": "ge>"}), ANSWER]},
            r"message 0: its parts write <image> across a part boundary",
        ),
        (
            {"text": "plain", "images": ["cat.png"]},
            r"field 'images': a plain-text record .* has no chat turns to place images in",
        ),
        (
            {"messages": [{"role": "user", "content": "?"}, ANSWER], "videos": ["a.mp4"]},
            r"field 'videos' holds videos \(multimodal data: this package trains on text and images\)",
        ),
    ],
)
def test_image_records_that_cannot_be_placed_are_refused_in_one_line_naming_record_and_field(data_dir, record, message):
    with pytest.raises(DataError, match=message) as err:
        convert(record, data_dir)
    assert str(err.value).startswith(where(data_dir) + ": ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"messages": [user({"type": "image", "image": "cat.png"}), ANSWER]},
            r"field 'messages\[0\].content\[0\]': a 'image' part; this model is text-only \(it has no image "
            r"processor\)",
        ),
        (
            {"messages": [user({"type": "image_url", "image_url": {"url": "https://x/y.png"}}), ANSWER]},
            r"a 'image_url' part; this model is text-only",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "images": ["cat.png"]},
            r"field 'images' holds images \(multimodal data: this model is text-only, it has no image processor",
        ),
        (
            {"conversations": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "A"}], "pics": ["x"]},
            r"field 'pics' holds images",
        ),
    ],
)
def test_a_text_only_model_refuses_every_image_in_one_line(data_dir, record, message):
    options = FormatOptions(columns={"images": "pics"}) if "pics" in record else None
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, where(data_dir), options=options)
    assert "\n" not in str(err.value)


def test_a_text_only_model_keeps_a_placeholder_as_text_and_gives_no_images(data_dir):
    record = {"messages": [{"role": "user", "content": "What does <image> mean in HTML?"}, ANSWER]}
    conversation = to_conversation(record, where(data_dir))
    assert conversation["messages"][0]["content"] == "What does <image> mean in HTML?"
    assert "images" not in conversation


def test_a_mapped_images_column_is_read_and_named_as_the_user_wrote_it(data_dir):
    record = {"messages": [{"role": "user", "content": "<image>?"}, ANSWER], "pics": ["cat.png", "cat.png"]}
    with pytest.raises(DataError, match=r"field 'pics' holds 2 image\(s\) for 1 image place"):
        convert(record, data_dir, columns={"images": "pics"})
    record["pics"] = ["cat.png"]
    assert convert(record, data_dir, columns={"images": "pics"})["images"] == [str(data_dir / "cat.png")]


def test_image_records_read_from_a_file_keep_its_folder(data_dir):
    """Through the record table: a row's location names its file, whose folder relative paths start from."""
    from hf_lora_ds.data.records import load_records

    sub = data_dir / "imgs"
    (sub / "data.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "<image>"}, ANSWER], "images": ["dog.png"]}) + "\n"
    )
    (record,) = load_records(sub / "data.jsonl")
    conversation = to_conversation(record.data, record.where, images=True)
    assert conversation["images"] == [str(sub / "dog.png")]
