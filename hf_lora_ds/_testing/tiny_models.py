"""Tiny Qwen2-architecture (and Mixture-of-Experts) chat models and tokenizers built from scratch, with no download.

Tests, benchmarks and the bundled demo model (``scripts/build_tiny_model.py``) all need a chat model whose
tokenizer behaves like Qwen's: ChatML special tokens, ``<|im_end|>`` as end of turn, byte-level BPE, digits split
one per token. Building one locally keeps every run offline and deterministic. ``build_tiny_moe`` builds the MoE
families users train (2 layers, 4 experts, top-2) from their transformers configs, for the same tokenizers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

__all__ = [
    "CHATML_TEMPLATE",
    "CHATML_DEFAULT_SYSTEM_TEMPLATE",
    "QWEN_TOOLS_TEMPLATE",
    "QWEN3_TEMPLATE",
    "QWEN3_ADDED_TOKENS",
    "DEFAULT_SYSTEM_PROMPT",
    "SPECIAL_TOKENS",
    "train_chat_tokenizer",
    "template_tokenizer",
    "build_tiny_qwen2",
    "MOE_FAMILIES",
    "MORE_MOE_FAMILIES",
    "build_tiny_moe",
]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Plain ChatML: a system turn appears only when the conversation has one.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2.5-style ChatML: injects a default system turn when the conversation has none.
CHATML_DEFAULT_SYSTEM_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2.5's tool handling, shortened: a tools block in the system turn, assistant tool calls as <tool_call> JSON,
# consecutive tool results merged into one user turn of <tool_response> blocks.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + DEFAULT_SYSTEM_PROMPT + "' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Qwen3's chat template as shipped (Qwen3-8B's tokenizer_config.json), line for line: reasoning from
# ``reasoning_content`` or ``<think>`` in the content, dropped from turns before the last user query, an empty think
# block on a final turn without reasoning, and ``enable_thinking=False`` adding that block to the generation prompt.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 (verbatim as shipped, so its long lines stay)
# Qwen3's added (non-special) tokens that its template writes around reasoning and tool calls.
QWEN3_ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def train_chat_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 512,
    chat_template: str = CHATML_DEFAULT_SYSTEM_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with ChatML special tokens on ``corpus``, with Qwen2's exact pre-tokenization.

    The pipeline (NFC, Qwen2's split regex, byte-level) is Qwen2's own, not only for realism: transformers reloads a
    saved ``qwen2`` model's tokenizer as ``Qwen2Tokenizer``, which rebuilds that pipeline from the vocabulary and
    merges, so any other pre-tokenizer would tokenize differently after a save/load round trip. Qwen2's regex also
    splits digits one per token, which keeps the arithmetic of the bundled demo learnable.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        padding_side="right",
        model_max_length=1024,
    )


# The tokens a chat template writes as literals: <|im_start|>, <start_of_turn>, <｜User｜>, [INST], <|turn>, <turn|>,
# and tags such as <think>, <tool_call>.
_TEMPLATE_TOKENS = re.compile(
    r"<\|[^<>|\s'\"]{1,40}\|?>|<[^<>|\s'\"]{1,40}\|>|<｜[^｜]{1,40}｜>|<[a-z_:/]{1,30}>|\[/?[A-Z_]{2,30}\]"
)
_TAG = re.compile(r"</?[a-z_:]+>")


def template_tokenizer(base: PreTrainedTokenizerFast, template: str) -> PreTrainedTokenizerFast:
    """``base``'s vocabulary with ``template`` as its chat template and the template's own tokens added, as its model's
    tokenizer has them: turn tokens (``<|im_start|>``, ``<start_of_turn>``, ``<｜end▁of▁sentence｜>``) as special
    tokens, tags the template also closes (``<think>``, ``<tool_call>``) as added ones. ``bos_token`` and ``eos_token``
    are ``<|bos|>`` and ``<|eos|>`` (the templates that write them read them from the tokenizer)."""
    tokens = sorted(set(_TEMPLATE_TOKENS.findall(template)))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(base.backend_tokenizer.to_str()),
        chat_template=template,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token=base.pad_token,
    )
    # A tag is one the template also closes (<think> ... </think>); <end_of_turn> and <sop> are turn tokens.
    tags = [
        t
        for t in tokens
        if _TAG.fullmatch(t)
        and t.replace("</", "<") in tokens
        and t.replace("<", "</", 1) in tokens
        or _TAG.fullmatch(t)
        and t.startswith("</")
    ]
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in tokens if t not in tags]})
    tokenizer.add_tokens(tags)
    return tokenizer


def build_tiny_qwen2(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM sized for ``tokenizer``; deterministic for a given ``seed``."""
    import torch

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_tiny_causal_lm(arch: str, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A tiny ``arch`` ("llama" or "qwen2") model with large random weights, for round trips that must show a wrong
    layout. Hidden 64 (whole Q8_0 blocks); Qwen2 ties its output to the embedding and has q/k/v biases, Llama not."""
    model = build_tiny_qwen2(tokenizer, hidden_size=64, num_hidden_layers=2)
    if arch == "llama":
        config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**{**config, "tie_word_embeddings": False}))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fresh init's logits are near zero: large weights make a wrong layout show
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    return model


# The five families of issue 52, then the others transformers 5 builds the same way (fused experts and a router).
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "deepseek_v3")
MORE_MOE_FAMILIES = (
    "glm4_moe",
    "olmoe",
    "deepseek_v2",
    "ernie4_5_moe",
    "hunyuan_v1_moe",
    "minimax_m2",
    "phimoe",
    "dots1",
    "flex_olmo",
)
_EXPERTS = 4
# Each family's own names for the sizes of its experts (and its shared experts and first dense layer), at hidden H.
_MOE_FIELDS = {
    "qwen3_moe": lambda h: {"moe_intermediate_size": h // 2, "num_experts": _EXPERTS, "head_dim": h // 4},
    "qwen2_moe": lambda h: {
        "moe_intermediate_size": h // 2,
        "shared_expert_intermediate_size": h,
        "num_experts": _EXPERTS,
    },
    "mixtral": lambda h: {"intermediate_size": h // 2, "num_local_experts": _EXPERTS, "head_dim": h // 4},
    "gpt_oss": lambda h: {
        "intermediate_size": h // 2,
        "num_local_experts": _EXPERTS,
        "head_dim": h // 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "deepseek_v3": lambda h: {**_latent_attention(h), "n_group": 1, "topk_group": 1},
    "deepseek_v2": lambda h: _latent_attention(h),
    "glm4_moe": lambda h: {**_dense_first_and_shared(h), "n_group": 1, "topk_group": 1, "head_dim": h // 4},
    "dots1": lambda h: _dense_first_and_shared(h),
    "olmoe": lambda h: {"intermediate_size": h // 2, "num_experts": _EXPERTS},
    "flex_olmo": lambda h: {"intermediate_size": h // 2, "num_experts": _EXPERTS},
    "ernie4_5_moe": lambda h: {
        "moe_intermediate_size": h // 2,
        "moe_num_experts": _EXPERTS,
        "moe_k": 2,
        "moe_num_shared_experts": 1,
        "moe_layer_start_index": 1,
    },
    "hunyuan_v1_moe": lambda h: {
        "intermediate_size": h // 2,
        "num_experts": _EXPERTS,
        "moe_topk": 2,
        "head_dim": h // 4,
    },
    "minimax_m2": lambda h: {"intermediate_size": h // 2, "num_local_experts": _EXPERTS, "head_dim": h // 4},
    "phimoe": lambda h: {"intermediate_size": h // 2, "num_local_experts": _EXPERTS},
}


def _dense_first_and_shared(h: int) -> dict:
    """A dense first layer, then routed experts beside one shared expert (DeepSeek-V3, GLM-4.5, dots.llm1)."""
    return {
        "moe_intermediate_size": h // 2,
        "n_routed_experts": _EXPERTS,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
    }


def _latent_attention(h: int) -> dict:
    """Multi-head latent attention at hidden ``h``, on top of the dense-first layout."""
    return {
        **_dense_first_and_shared(h),
        "kv_lora_rank": h // 4,
        "q_lora_rank": h // 2,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": h // 4,
        "num_key_value_heads": 4,
    }


def build_tiny_moe(family: str, tokenizer: PreTrainedTokenizerFast, hidden_size: int = 32, seed: int = 0):
    """A randomly initialised MoE model of ``family`` (a transformers ``model_type`` of ``MOE_FAMILIES`` or
    ``MORE_MOE_FAMILIES``) sized for ``tokenizer``: 2 layers, 4 experts, 2 a token, 4 heads; deterministic for a
    given ``seed``."""
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,  # the dense layers'
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 512,
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = AutoConfig.for_model(family, **{**common, **_MOE_FIELDS[family](hidden_size)})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
