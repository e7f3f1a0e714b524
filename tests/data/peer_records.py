"""Expectations for the peers' record kinds, built without the reader: the ChatML text written out by hand, the
trained characters found by locating the answer strings in it, and a token trained iff its first character is."""

from __future__ import annotations

from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset

END = "<|im_end|>"
JOKE = "I'm doing very well, thank you!"


def chatml(*turns: tuple[str, str]) -> str:
    """``(role, content)`` turns as the test ChatML template writes them."""
    return "".join(f"<|im_start|>{role}\n{content}{END}\n" for role, content in turns)


def trained_chars(text: str, answers: list[str]) -> list[bool]:
    """Each answer string (content and end-of-turn token), located in order after the previous one, trained."""
    trained, at = [False] * len(text), 0
    for answer in answers:
        start = text.index(f"<|im_start|>assistant\n{answer}", at) + len("<|im_start|>assistant\n")
        for i in range(start, start + len(answer)):
            trained[i] = True
        at = start + len(answer)
    return trained


def labels_of(tokenizer, text: str, trained: list[bool]) -> tuple[list[int], list[int]]:
    """Ids of ``text`` and their labels: a token is trained iff its first character is."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    return ids, [t if trained[start] else IGNORE_INDEX for t, (start, _) in zip(ids, encoded["offset_mapping"])]


def expect(tokenizer, text: str, answers: list[str]) -> tuple[list[int], list[int]]:
    return labels_of(tokenizer, text, trained_chars(text, answers))


def build(records, tokenizer, tmp_path, **kwargs) -> ChatSFTDataset:
    return ChatSFTDataset(records, tokenizer, cache_dir=tmp_path, **kwargs)


def sample(dataset: ChatSFTDataset, i: int = 0) -> tuple[list[int], list[int]]:
    return dataset[i]["input_ids"], dataset[i]["labels"]


def axolotl_documented_example() -> dict:
    """axolotl's fine-grained example (docs/dataset-formats/conversation.qmd), written here from what it says: every
    turn flagged, two human turns with train: true (the second repeats the answer before it), one answer trained in
    the span its train_detail gives (offsets inclusive)."""
    return {
        "conversations": [
            {"from": "system", "value": "You are an AI assistant.", "train": False},
            {"from": "human", "value": "Hello", "train": False},
            {"from": "assistant", "value": "Hello", "train": True},
            {"from": "human", "value": "How are you?", "train": True},
            {
                "from": "assistant",
                "value": JOKE,
                "train_detail": [
                    {"begin_offset": 0, "end_offset": 8, "train": False},
                    {"begin_offset": 9, "end_offset": 18, "train": True},
                    {"begin_offset": 19, "end_offset": 30, "train": False},
                ],
            },
            {"from": "human", "value": JOKE, "train": True},
            {"from": "assistant", "value": "Hi there!", "train": True},
        ]
    }


def axolotl_text(question: str = JOKE) -> str:
    """The ChatML text of axolotl's documented example (its second human turn ``question``)."""
    return chatml(
        ("system", "You are an AI assistant."),
        ("user", "Hello"),
        ("assistant", "Hello"),
        ("user", "How are you?"),
        ("assistant", JOKE),
        ("user", question),
        ("assistant", "Hi there!"),
    )
