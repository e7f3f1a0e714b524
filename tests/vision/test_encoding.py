"""Image records tokenized exactly, for every tiny family: the dataset's ids are the processor's own for the text the
family's template writes (image parts and all), and the supervised tokens are each assistant answer plus its
end-of-turn token, found here in those ids, never an image token.

The oracle is independent of hf_lora_ds.vision.encoding: the conversation rendered by the family's chat template with
real ``{"type": "image"}`` parts and tokenized by ``processor(text=..., images=...)``, and each answer's tokens
tokenized alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hf_lora_ds._testing.tiny_vlms import MORE_VLM_FAMILIES, VLM_FAMILIES, build_tiny_vlm
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.data.records import DataError
from hf_lora_ds.errors import UserError
from tests.vision.conftest import family_and_records, image_folder, once_per_family

FAMILIES = VLM_FAMILIES + MORE_VLM_FAMILIES
SIZES = {"a.png": (64, 64), "b.png": (48, 80), "c.png": (96, 64)}  # different sizes: different token counts

# What each family's real template writes for an image part.
IMAGE_TEXT = {
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl_moe": "<|vision_start|><|image_pad|><|vision_end|>",
    "smolvlm": "<image>",
    "idefics3": "<image>",
    "gemma3": "<start_of_image>",
    "llava_onevision": "<image>\n",
    "llava_next": "<image>\n",
    "internvl": "<IMG_CONTEXT>\n",
    "llava": "<image>\n",
}
# What the generation prompt leaves before an answer ("Assistant:" and "ASSISTANT:" end without the space).
ANSWER_LEAD = {"smolvlm": " ", "idefics3": " ", "llava": " "}


def image(name: str) -> dict:
    return {"type": "image", "image": f"img/{name}"}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def assistant(answer: str) -> dict:
    return {"role": "assistant", "content": answer}


# (the record as written in the file, the conversation as the template takes it with image parts, its images)
CASES = [
    ({"messages": [user(image("a.png"), text("colour?")), assistant("red")]}, None),
    (  # two images in one turn, as LLaVA-style placeholders with an images column
        {
            "messages": [{"role": "user", "content": "compare <image> and <image> now"}, assistant("the same")],
            "images": ["img/b.png", "img/c.png"],
        },
        [user(text("compare "), image("b.png"), text(" and "), image("c.png"), text(" now")), assistant("the same")],
    ),
    (  # images in two user turns of one conversation
        {
            "messages": [
                user(image("a.png"), text("what is it?")),
                assistant("a cat"),
                user(text("and this? "), image("c.png")),  # an image that ends its turn
                assistant("a dog"),
            ]
        },
        None,
    ),
    ({"messages": [{"role": "user", "content": "hello"}, assistant("hi there")]}, None),  # text only
    (  # two adjacent images after a system turn (Gemma 3 folds it into the first user turn)
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                user(image("b.png"), image("a.png"), text("same?")),
                assistant("no"),
            ]
        },
        None,
    ),
]


def conversation(case) -> list[dict]:
    record, messages = case
    return messages or record["messages"]


def pictures(messages: list[dict], root: Path) -> list[Image.Image]:
    """The conversation's images in order, opened here (PIL), as the oracle gives them to the processor."""
    return [
        Image.open(root / part["image"]).convert("RGB")
        for message in messages
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image"
    ]


def write(root: Path, name: str, records: list[dict]) -> Path:
    path = root / name
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A data folder: images under img/ (paths in the records are relative to the data file) and the records."""
    root = tmp_path_factory.mktemp("vision_data")
    image_folder(root, SIZES)
    write(root, "records.jsonl", [record for record, _ in CASES])
    return root


@pytest.fixture(scope="module")
def built(root):
    """``family -> (processor, dataset of CASES)``, each built once for the module."""
    return once_per_family(lambda family: family_and_records(family, root)[1:])


def expected_labels(tokenizer, ids: np.ndarray, answers: list[str], lead: str) -> np.ndarray:
    """-100 everywhere but each answer's tokens (with its end-of-turn token), found in order in ``ids``."""
    labels = np.full(len(ids), IGNORE_INDEX)
    start = 0
    for answer in answers:
        want = tokenizer(lead + answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        at = next((i for i in range(start, len(ids) - len(want) + 1) if ids[i : i + len(want)].tolist() == want), None)
        assert at is not None, f"answer {answer!r} ({want}) is not in the ids"
        labels[at : at + len(want)] = want
        start = at + len(want)
    return labels


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_are_the_processors_and_labels_exactly_the_answers(family, built, root):
    processor, dataset = built(family)
    tokenizer = processor.tokenizer
    image_ids = dataset.encoder.vision.image_ids
    assert len(dataset) == len(CASES)
    for k, case in enumerate(CASES):
        messages = conversation(case)
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        images = pictures(messages, root)
        want = processor(text=[rendered], images=[images] if images else None)["input_ids"][0]
        sample = dataset[k]
        ids, labels = np.asarray(sample["input_ids"]), np.asarray(sample["labels"])
        assert ids.tolist() == list(want), f"case {k}: the dataset's ids are not the processor's"
        assert len(sample["images"]) == len(images)
        answers = [message["content"] for message in messages if message["role"] == "assistant"]
        assert labels.tolist() == expected_labels(tokenizer, ids, answers, ANSWER_LEAD.get(family, "")).tolist()
        assert (labels[np.isin(ids, image_ids)] == IGNORE_INDEX).all()


@pytest.mark.parametrize("family", ["smolvlm", "idefics3"])
def test_split_images_are_the_processors(family, root):
    """SmolVLM and Idefics3 checkpoints split an image into crops by default: row/column text and newlines between
    the crops' image tokens, all of it outside the labels."""
    _, processor = build_tiny_vlm(family)
    processor.image_processor.do_image_splitting = True
    processor.image_processor.max_image_size = {"longest_edge": 32}
    dataset = ChatSFTDataset(
        str(root / "records.jsonl"), processor.tokenizer, processor=processor, cache_dir=root / "cache"
    )
    for k in (1, 2):  # two images in a turn, images in two turns
        messages = conversation(CASES[k])
        rendered = processor.tokenizer.apply_chat_template(messages, tokenize=False)
        want = processor(text=[rendered], images=[pictures(messages, root)])["input_ids"][0]
        ids, labels = np.asarray(dataset[k]["input_ids"]), np.asarray(dataset[k]["labels"])
        assert ids.tolist() == list(want) and "<row_1_col_2>" in processor.tokenizer.decode(ids)
        answers = [message["content"] for message in messages if message["role"] == "assistant"]
        assert labels.tolist() == expected_labels(processor.tokenizer, ids, answers, " ").tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_image_tokens_and_text(family, built):
    processor, dataset = built(family)
    tokenizer, vision = processor.tokenizer, dataset.encoder.vision
    assert vision.image_text == IMAGE_TEXT[family]
    rendered = tokenizer.apply_chat_template([user(text("A"), {"type": "image"}, text("B"))], tokenize=False)
    assert "A" + vision.image_text + "B" in rendered
    # the image's placeholder token is one of the ids never trained, and the template's own turn tokens are not
    placeholder = tokenizer.convert_tokens_to_ids(processor.image_token)
    assert placeholder in vision.image_ids
    assert tokenizer.eos_token_id not in vision.image_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_image_in_an_assistant_turn_is_refused_naming_the_record(family, built, root):
    processor, _ = built(family)
    good, _ = CASES[3]
    bad = {"messages": [user(text("draw")), {"role": "assistant", "content": [image("a.png"), text("here")]}]}
    path = write(root, f"assistant_image_{family}.jsonl", [good, bad])
    with pytest.raises(UserError) as err:
        ChatSFTDataset(str(path), processor.tokenizer, processor=processor, cache_dir=root / "cache")
    message = str(err.value)
    assert f"{path}, line 2" in message and "\n" not in message


@pytest.mark.parametrize("family", FAMILIES)
def test_placeholders_and_images_counted(family, built, root):
    processor, _ = built(family)
    good, _ = CASES[3]
    bad = {"messages": [{"role": "user", "content": "<image> and <image>"}, assistant("x")], "images": ["img/a.png"]}
    path = write(root, f"mismatch_{family}.jsonl", [good, bad])
    with pytest.raises(DataError) as err:
        ChatSFTDataset(str(path), processor.tokenizer, processor=processor, cache_dir=root / "cache")
    message = str(err.value)
    assert f"{path}, line 2" in message and "\n" not in message and "1 image" in message


def truncation_data(family, built, root) -> tuple[Path, int, int]:
    """A data file whose line 2 has a long text before its image, after a short text-only record on line 1; the
    length that cuts line 2 inside its image (while line 1 fits), and line 2's whole length."""
    processor, _ = built(family)
    short, _ = CASES[3]
    long_record = {"messages": [user(text("word " * 40), image("a.png"), text("?")), assistant("yes")]}
    path = write(root, f"truncation_{family}.jsonl", [short, long_record])
    whole = ChatSFTDataset(str(path), processor.tokenizer, processor=processor, cache_dir=root / "cache")
    ids = np.asarray(whole[1]["input_ids"])
    first_image = int(np.flatnonzero(np.isin(ids, whole.encoder.vision.image_ids))[0])
    assert first_image + 2 >= len(whole[0]["input_ids"]), "the short record must fit where the long one is cut"
    return path, first_image + 2, len(ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_truncation_inside_an_image_drops_and_counts(family, built, root):
    processor, _ = built(family)
    path, cut, whole = truncation_data(family, built, root)
    dataset = ChatSFTDataset(
        str(path), processor.tokenizer, processor=processor, cache_dir=root / "cache", max_length=cut
    )
    assert dataset.num_image_cut == 1
    assert len(dataset) == 1 and not dataset[0]["images"]
    # cut in the answer, after the image: kept, its image whole
    dataset = ChatSFTDataset(
        str(path), processor.tokenizer, processor=processor, cache_dir=root / "cache", max_length=whole - 2
    )
    assert dataset.num_image_cut == 0 and len(dataset) == 2 and len(dataset[1]["images"]) == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_truncation_inside_an_image_is_an_error_when_asked(family, built, root):
    processor, _ = built(family)
    path, cut, _ = truncation_data(family, built, root)
    with pytest.raises(DataError) as err:
        ChatSFTDataset(
            str(path),
            processor.tokenizer,
            processor=processor,
            cache_dir=root / "cache",
            max_length=cut,
            on_empty_labels="error",
        )
    message = str(err.value)
    assert f"{path}, line 2" in message and "image" in message and "\n" not in message


@pytest.mark.parametrize(
    ("family", "setting", "value"), [("smolvlm", "image_seq_len", 9), ("internvl", "image_seq_length", 4)]
)
def test_cached_samples_follow_the_processors_settings(family, setting, value, root):
    """A processor whose image expands to another number of tokens (same tokenizer, same image processor) reads no
    samples cached for the first: their image tokens would not match the image's features."""
    messages, images = conversation(CASES[0]), pictures(conversation(CASES[0]), root)
    for changed in (False, True):
        _, processor = build_tiny_vlm(family)
        if changed:
            setattr(processor, setting, value)
        rendered = processor.tokenizer.apply_chat_template(messages, tokenize=False)
        want = processor(text=[rendered], images=[images])["input_ids"][0]
        dataset = ChatSFTDataset(
            str(root / "records.jsonl"), processor.tokenizer, processor=processor, cache_dir=root / "cache"
        )
        assert dataset[0]["input_ids"] == list(want)


def test_template_that_writes_nothing_for_an_image_is_refused(built, root):
    processor, _ = built("qwen2_5_vl")
    tokenizer = processor.tokenizer
    template = tokenizer.chat_template
    try:
        tokenizer.chat_template = template.replace("'<|vision_start|><|image_pad|><|vision_end|>'", "''")
        with pytest.raises(TemplateError, match="writes nothing for an image part"):
            ChatSFTDataset([CASES[3][0]], tokenizer, processor=processor, cache_dir=root / "cache")
    finally:
        tokenizer.chat_template = template
