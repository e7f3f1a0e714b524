"""Train-to-inference round trip: inference prompts start the training texts on the shipped templates, and a template
where they do not is named by its first differing tokens, at start and in the audit."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, Qwen2Config

from hf_lora_ds import audit
from hf_lora_ds.data.dataset import ChatSFTDataset, TemplateError
from hf_lora_ds.data.inference_prompts import check_round_trip, round_trip, turn_difference
from hf_lora_ds.testing import QWEN3_TEMPLATE
from tests import REPO
from tests.data.test_thinking import TOOL_CONVERSATION, TWO_TURNS, USER

DEMO = REPO / "data"
ALPACA = {"instruction": "12=", "output": "3 + 9"}


def without_reasoning(messages: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


MULTI_TURN = {"messages": without_reasoning(TWO_TURNS)}
# A Qwen3 variant that writes no empty think block for a final turn without reasoning, while its enable_thinking=False
# generation prompt still adds one: training would teach answers after a context inference never gives.
NO_EMPTY_THINK = QWEN3_TEMPLATE.replace("{%- if loop.last or (not loop.last and reasoning_content) %}", "{%- if reasoning_content %}")


def dataset(records, tokenizer, tmp_path) -> ChatSFTDataset:
    return ChatSFTDataset(records, tokenizer, cache_dir=tmp_path)


@pytest.mark.parametrize(
    "fixture, records, turns",
    [
        ("qwen_style_tokenizer", [ALPACA, MULTI_TURN], 3),
        ("tools_tokenizer", [{**TOOL_CONVERSATION, "messages": without_reasoning(TOOL_CONVERSATION["messages"])}], 2),
        ("qwen3_tokenizer", [ALPACA, MULTI_TURN, {"messages": TWO_TURNS}, TOOL_CONVERSATION], 7),
    ],
)
def test_shipped_and_qwen3_templates_round_trip(request, tmp_path, fixture, records, turns):
    tokenizer = request.getfixturevalue(fixture)
    result = check_round_trip(dataset(records, tokenizer, tmp_path))
    assert (result.turns, result.failures, result.first) == (turns, 0, None)


def test_demo_model_template_round_trips(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "tiny-qwen2-sum")
    result = check_round_trip(dataset(str(DEMO / "sum_to_x" / "train.json"), tokenizer, tmp_path))
    assert (result.turns, result.failures) == (64, 0)


def test_broken_template_is_named_by_its_first_differing_tokens(qwen3_tokenizer, tmp_path):
    tokenizer = qwen3_tokenizer.__class__(
        tokenizer_object=qwen3_tokenizer.backend_tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=NO_EMPTY_THINK,
    )
    data = dataset([{"messages": TWO_TURNS}, ALPACA], tokenizer, tmp_path)  # turns with reasoning still round-trip
    at = len(tokenizer(USER.format("12="), add_special_tokens=False)["input_ids"])
    difference = (
        f"record 1, assistant turn 1 (enable_thinking=False): token {at}: prompt ['<think>', '\\n', '\\n', '</think>'] "
        "vs training text ['3', ' ', '+', ' ']"
    )
    with pytest.raises(TemplateError, match="inference prompt is not the start of the training text") as err:
        check_round_trip(data)
    assert str(err.value).endswith(f"(1/3 trained turns of the first 64 records): {difference}; the model would be "
                                   "trained on contexts inference never gives it: fix the chat template")
    tokenizer.save_pretrained(tmp_path / "tok")
    Qwen2Config(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "tok")  # the audit CLI reads a model directory
    (tmp_path / "data.jsonl").write_text('{"instruction": "1=", "output": "1"}\n' * 3)
    report = audit.main(["--train_file", str(tmp_path / "data.jsonl"), "--model_name_or_path", str(tmp_path / "tok")])
    assert report.round_trip.turns == 3 and report.round_trip.failures == 3
    assert "round trip: 0/3 trained turns' inference prompts start their training text" in str(report)
    assert round_trip(data, limit=1).failures == 0


def test_generation_prompt_that_is_not_the_turn_header_is_named(chatml_tokenizer, tmp_path):
    bot = (
        "{%- for m in messages %}{{ '<|im_start|>' + (m['role'] if m['role'] != 'assistant' else 'bot') + '\\n' + "
        "m['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{%- endif %}"
    )
    tokenizer = chatml_tokenizer.__class__(
        tokenizer_object=chatml_tokenizer.backend_tokenizer, eos_token="<|im_end|>", chat_template=bot
    )
    at = len(tokenizer(USER.format("12=").removesuffix("assistant\n"), add_special_tokens=False)["input_ids"])
    difference = f"(token {at}: prompt ['a', 'ss', 'istan', 't'] vs rendered turn ['b', 'o', 't', '\\n'])"
    with pytest.raises(TemplateError, match="generation prompt is not a prefix of assistant turn 1 as it renders it ") as err:
        dataset([ALPACA], tokenizer, tmp_path)
    assert difference in str(err.value)


def test_the_prompts_last_token_is_compared_too(chatml_tokenizer):
    """A training text that differs from the inference prompt at the prompt's last token only (the generation prompt's
    final newline, say) is a difference: the model would be trained after a context inference never ends with."""
    messages = [{"role": "user", "content": "12="}, {"role": "assistant", "content": "3 + 9"}]
    prompt = chatml_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    prompt_ids = chatml_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer = chatml_tokenizer("3 + 9<|im_end|>", add_special_tokens=False)["input_ids"]
    assert turn_difference(chatml_tokenizer, messages, 1, None, prompt_ids + answer) is None
    other = next(token for token in answer if token != prompt_ids[-1])
    difference = turn_difference(chatml_tokenizer, messages, 1, None, prompt_ids[:-1] + [other] + answer)
    assert difference is not None and difference.startswith("assistant turn 1 (enable_thinking=False): ")
