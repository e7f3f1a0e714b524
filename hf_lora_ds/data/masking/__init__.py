"""Masking: which characters of a conversation's training texts are trained, derived from the chat template as
inference uses it. The label rule (``template_rule``) with what render probes find a template does around a turn
(``template_probes``), its fast path for templates blind to the contents (``template_blindness``, ``skeleton``),
thinking models' reasoning (``thinking``), per-turn and per-span training flags (``turn_flags``) and the user turns
they train (``user_turns``), and TRL's plain-text kinds, trained without a template (``plain_text``). The dataset
calls the rule through what this package exports."""

from hf_lora_ds.data.masking.plain_text import PlainText
from hf_lora_ds.data.masking.skeleton import Locator
from hf_lora_ds.data.masking.template_rule import (
    IGNORE_INDEX,
    AssistantTurns,
    TemplateError,
    TrainingText,
    TurnRules,
    prefix_samples,
    render_samples,
)
from hf_lora_ds.data.masking.thinking import ThinkingOptions, as_template_reads
from hf_lora_ds.data.masking.turn_flags import TextMask, plan_turns, text_mask
from hf_lora_ds.data.masking.user_turns import with_user_turns

__all__ = [
    "IGNORE_INDEX",
    "AssistantTurns",
    "Locator",
    "PlainText",
    "TemplateError",
    "TextMask",
    "ThinkingOptions",
    "TrainingText",
    "TurnRules",
    "as_template_reads",
    "plan_turns",
    "prefix_samples",
    "render_samples",
    "text_mask",
    "with_user_turns",
]
