"""Train-to-inference round trip: inference prompts start the training texts on the shipped templates, and a template
where they do not is named by its first differing tokens, at start and in the audit."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, Qwen2Config

from hf_lora_ds import audit
from hf_lora_ds._testing.tiny_models import QWEN3_TEMPLATE
from hf_lora_ds.data.audit import inference_prompts
from hf_lora_ds.data.audit.inference_prompts import check_round_trip, round_trip, turn_difference
from hf_lora_ds.data.dataset import ChatSFTDataset, TemplateError
from tests import REPO
from tests.data.masking.test_thinking import TOOL_CONVERSATION, TWO_TURNS, USER

DEMO = REPO / "data"
ALPACA = {"instruction": "12=", "output": "3 + 9"}


def without_reasoning(messages: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


MULTI_TURN = {"messages": without_reasoning(TWO_TURNS)}
# A Qwen3 variant that writes no empty think block for a final turn without reasoning, while its enable_thinking=False
# generation prompt still adds one: training would teach answers after a context inference never gives.
NO_EMPTY_THINK = QWEN3_TEMPLATE.replace(
    "{%- if loop.last or (not loop.last and reasoning_content) %}", "{%- if reasoning_content %}"
)


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


def test_template_whose_history_differs_from_its_inference_prompt_is_refused(qwen3_tokenizer, tmp_path):
    # The label rule trains each turn after its inference prompt, so a template whose rendered turn does not follow
    # that prompt is refused when the record is tokenized, naming the record and the first differing tokens.
    tokenizer = qwen3_tokenizer.__class__(
        tokenizer_object=qwen3_tokenizer.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=NO_EMPTY_THINK,
    )
    assert len(dataset([{"messages": TWO_TURNS}], tokenizer, tmp_path)) == 2  # turns with reasoning still train
    at = len(tokenizer(USER.format("12="), add_special_tokens=False)["input_ids"])
    with pytest.raises(TemplateError, match="generation prompt is not a prefix of assistant turn 1") as err:
        dataset([{"messages": TWO_TURNS}, ALPACA], tokenizer, tmp_path)
    assert str(err.value).startswith("record 1: ")
    assert f"token {at}: prompt ['<think>', '\\n', '\\n', '</think>'] vs rendered turn ['3', ' ', '+', ' ']" in str(
        err.value
    )


def test_training_ids_that_differ_from_the_inference_prompt_are_named(qwen3_tokenizer, tmp_path, monkeypatch):
    # A tokenizer that tokenizes a training text otherwise than its prompt alone (stood in for here by training ids
    # with one token changed) fails the start check and is counted by the audit.
    data = dataset([{"messages": TWO_TURNS}, ALPACA], qwen3_tokenizer, tmp_path)
    at = len(qwen3_tokenizer(USER.format("12="), add_special_tokens=False)["input_ids"]) - 1
    real = inference_prompts.sample_tokens

    def changed(tokenizer, text, spans):
        ids = real(tokenizer, text, spans)
        return ids if "12=" not in text else ids[:at] + [tokenizer.pad_token_id] + ids[at + 1 :]

    monkeypatch.setattr(inference_prompts, "sample_tokens", changed)
    with pytest.raises(TemplateError, match="inference prompt is not the start of the training text") as err:
        check_round_trip(data)
    difference = (
        f"(1/3 trained turns of the first 64 records): record 1, assistant turn 1 (enable_thinking=False): "
        f"token {at}: prompt ['\\n', '<think>', '\\n', '\\n'] vs training text ['<|endoftext|>', '<think>', "
    )
    assert difference in str(err.value)
    assert round_trip(data, limit=1).failures == 0
    qwen3_tokenizer.save_pretrained(tmp_path / "tok")
    Qwen2Config(vocab_size=len(qwen3_tokenizer)).save_pretrained(tmp_path / "tok")  # the audit CLI reads a model dir
    (tmp_path / "data.jsonl").write_text('{"instruction": "12=", "output": "1"}\n' * 3)
    report = audit.main(["--train_file", str(tmp_path / "data.jsonl"), "--model_name_or_path", str(tmp_path / "tok")])
    assert report.round_trip.turns == 3 and report.round_trip.failures == 3
    assert "round trip: 0/3 trained turns' inference prompts start their training text" in str(report)


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
    with pytest.raises(
        TemplateError, match="generation prompt is not a prefix of assistant turn 1 as it renders it "
    ) as err:
        dataset([ALPACA], tokenizer, tmp_path)
    assert difference in str(err.value)


def test_the_prompts_last_token_is_compared_too(chatml_tokenizer):
    """A training text that differs from the inference prompt at the prompt's last token only (the generation prompt's
    final newline, say) is a difference: the model would be trained after a context inference never ends with."""
    messages = [{"role": "user", "content": "12="}, {"role": "assistant", "content": "3 + 9"}]
    prompt = chatml_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    prompt_ids = chatml_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer = chatml_tokenizer("3 + 9<|im_end|>", add_special_tokens=False)["input_ids"]
    assert turn_difference(chatml_tokenizer, messages, 1, None, prompt_ids + answer, False) is None
    other = next(token for token in answer if token != prompt_ids[-1])
    difference = turn_difference(chatml_tokenizer, messages, 1, None, prompt_ids[:-1] + [other] + answer, False)
    assert difference is not None and difference.startswith("assistant turn 1 (enable_thinking=False): ")
