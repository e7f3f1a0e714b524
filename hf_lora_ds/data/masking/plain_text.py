"""TRL's standard kinds, ``{"text"}`` and ``{"prompt": str, "completion": str}``, as TRL trains them: plain text.

TRL renders no chat template for them: it tokenizes the text (with the tokenizer's own special tokens, a BOS where
the tokenizer adds one), appends the eos token, and trains everything after the prompt (all of a ``text``). So
here: the training text is the BOS the tokenizer adds, the prompt, the completion and eos; the completion and eos
are the trained span. The prompt is tokenized on its own where a token would cross into the completion, as inference
tokenizes it (``hf_lora_ds.data.tokens.labels``). To train such records as a chat turn instead, map them onto the alpaca
fields: ``--columns prompt=prompt,response=completion``.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from hf_lora_ds.data.masking.template_rule import TemplateError, TrainingText

__all__ = ["PlainText"]


class PlainText:
    """The training text of a plain-text record for one tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.eos = tokenizer.eos_token
        with_specials = tokenizer("a", add_special_tokens=True)["input_ids"]
        adds_bos = tokenizer.bos_token_id is not None and with_specials[:1] == [tokenizer.bos_token_id]
        self.bos = tokenizer.bos_token if adds_bos else ""

    def sample(self, conversation: dict[str, Any]) -> TrainingText:
        if not self.eos:
            raise TemplateError(
                "the tokenizer has no eos_token to end a plain-text sample (TRL's 'text' or string "
                "'prompt'/'completion' records) with; set tokenizer.eos_token"
            )
        text = self.bos + conversation["text"]
        if not text.endswith(self.eos):
            text += self.eos
        return TrainingText(text, [(len(self.bos) + conversation["prompt_chars"], len(text))], [])
