"""The proof that a chat template never looks at the contents it writes: the shipped templates and ones written like
the common models' pass; every way of looking at a content or a whole message, and anything it cannot follow, fails."""

from __future__ import annotations

import pytest

from hf_lora_ds._testing.tiny_models import (
    CHATML_DEFAULT_SYSTEM_TEMPLATE,
    CHATML_TEMPLATE,
    QWEN3_TEMPLATE,
    QWEN_TOOLS_TEMPLATE,
)
from hf_lora_ds.data.masking.template_blindness import content_blind

LOOP = "{%- for message in messages %}{}{%- endfor %}"
WRITE = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"


def in_loop(body: str) -> str:
    return LOOP.replace("{}", body)


@pytest.mark.parametrize(
    "template",
    [
        CHATML_TEMPLATE,
        CHATML_DEFAULT_SYSTEM_TEMPLATE,
        QWEN_TOOLS_TEMPLATE,
        # SmolLM2's own template: a default system turn unless the first message is one.
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
        "You are SmolLM<|im_end|>\\n' }}{% endif %}" + WRITE + "{% endfor %}",
        # Phi-3 style, a content tested for being there, names bound to messages and to a content.
        in_loop("{{ '<|' + message.role + '|>\\n' + message.content + '<|end|>\\n' }}"),
        in_loop("{% if message.content and message.content is string %}" + WRITE + "{% endif %}"),
        "{% set first = messages[0] %}{% set system = first.content %}{{ system }}" + in_loop(WRITE),
        in_loop("{% if loop.previtem is defined and loop.previtem.role == 'user' %}{{ 'after a user' }}{% endif %}"),
        in_loop("{{ message.content ~ '\\n' }}{{ (messages|length) - loop.index0 }}"),
    ],
)
def test_templates_that_only_write_contents_are_blind(template):
    assert content_blind(template)


@pytest.mark.parametrize(
    "body",
    [
        "{{ message['content'] | trim }}",  # transformed: where it ends depends on it
        "{% if 'x' in message.content %}{{ 'x' }}{% endif %}",
        "{% if message.content == 'hi' %}{{ 'hi' }}{% endif %}",
        "{% if message.content is eq 'hi' %}{{ 'hi' }}{% endif %}",  # the comparison as a test
        "{% if message['content'] is in ['hi', 'hello'] %}{{ 'hi' }}{% endif %}",
        "{% if message is eq messages[0] %}{{ 'first' }}{% endif %}",  # a whole message compared
        "{% if message.content.startswith('<tool_response>') %}{{ 'tool' }}{% endif %}",
        "{{ message.content.split('</think>')[-1] }}",
        "{{ message.content[0] }}",
        "{{ message | tojson }}",  # a whole message, whatever it holds
        "{{ message }}",
        "{{ message.get('content') }}",
        "{{ message[key] | trim }}",
        "{% for c in message.content %}{{ c }}{% endfor %}",
        "{% set ns.text = message.content %}",
        "{{ '%s' % message.content }}",
        "{{ strftime_now('%d %b %Y') }}",  # a date: another render may give another text
        "{{ [1, 2] | random }}",
        "{% macro show(m) %}{{ m.content }}{% endmacro %}{{ show(message) }}",
        "{{ loop.nextitem | tojson }}",
        "{{ (messages | map(attribute='content') | list) | length }}",
        "{% generation %}{{ message.content }}{% endgeneration %}",  # not parsed here: not proven
    ],
)
def test_templates_that_look_at_contents_or_messages_are_not(body):
    assert not content_blind(in_loop(body))


def test_qwen3_looks_at_contents():
    """It splits reasoning off the content and tests user turns for tool responses."""
    assert not content_blind(QWEN3_TEMPLATE)
