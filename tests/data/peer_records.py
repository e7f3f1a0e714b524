"""Expectations for the peers' record kinds, built without the reader: the ChatML text written out by hand, the
trained characters found by locating the answer strings in it, and a token trained iff its first character is; the
tool-calling records (OpenAI messages, LLaMA-Factory ShareGPT) and their pieces as the tools template renders them."""

from __future__ import annotations

import json

from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset

END = "<|im_end|>"
JOKE = "I'm doing very well, thank you!"
SYSTEM = "You are a helpful assistant."
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"city": {"type": "string"}}}}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_MESSAGES = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
]
SHAREGPT_TOOLS = {
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "sunny"},
        {"from": "gpt", "value": "It is sunny."},
    ],
    "tools": json.dumps([TOOL]),
}


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


def expected(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Token ids and labels of a text given as (piece, trained?) pairs, tokenized piece by piece."""
    input_ids, labels = [], []
    for text, trained in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids += piece
        labels += piece if trained else [IGNORE_INDEX] * len(piece)
    return input_ids, labels


def tool_pieces() -> list[tuple[str, bool]]:
    """The tool conversation as the Qwen2.5-like template renders it: the call and the answer trained, the tool
    result (a user turn of <tool_response>) not."""
    return [
        (f"<|im_start|>system\n{SYSTEM}\n\n# Tools\n<tools>\n{json.dumps(TOOL)}\n</tools><|im_end|>\n", False),
        ("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n", False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>', True),
        ("\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n", False),
        ("It is sunny.<|im_end|>", True),
        ("\n", False),
    ]


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
