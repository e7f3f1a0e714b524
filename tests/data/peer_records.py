"""Expectations for the peers' record kinds, built without the reader: the ChatML text written out by hand, the
trained characters found by locating the answer strings in it, and a token trained iff its first character is."""

from __future__ import annotations

from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset

END = "<|im_end|>"


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
