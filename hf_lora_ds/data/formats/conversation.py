"""Any record, of any registered format, as one validated conversation.

A record's own column names are mapped first (``columns``), another framework's field this package cannot honour
(preference pairs, video, audio; images for a text-only model) is refused, then the record's format (``registry``)
reads it, and its images are placed (``images``); fields no reader used are listed in ``unused``.
"""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.formats.columns import FieldNames, FormatOptions, map_columns
from hf_lora_ds.data.formats.images import place_images
from hf_lora_ds.data.formats.registry import accepted_kinds, format_of
from hf_lora_ds.data.formats.turns import Reading
from hf_lora_ds.data.records import DataError

__all__ = ["to_conversation", "to_messages"]

# Fields of other frameworks' records that this package cannot honour, and why: refused, never ignored.
REFUSED_FIELDS = {
    "images": "images (multimodal data: this model is text-only, it has no image processor; train a vision-language "
    "model)",
    "videos": "videos (multimodal data: this package trains on text and images)",
    "audios": "audios (multimodal data: this package trains on text and images)",
    "chosen": "a preference pair (chosen/rejected: DPO or reward-model data, not SFT)",
    "rejected": "a preference pair (chosen/rejected: DPO or reward-model data, not SFT)",
    "kto_tag": "a KTO label (unpaired preference data, not SFT)",
}


def to_conversation(
    record: Any,
    where: str,
    system_prompt: str | None = None,
    options: FormatOptions | None = None,
    *,
    images: bool = False,
) -> dict[str, Any]:
    """Validate one record of any registered format and return ``{"messages": [...], "tools": list | None}``, with
    ``system_prompt`` first when the record brings no system turn of its own (its own wins).

    ``images``: whether the run's model takes images (it has an image processor). Then the conversation has
    ``images``, the record's images in the order their ``IMAGE_MARK`` stands in the messages' text (``images``
    module); without it a record with images is refused in one line, and ``<image>`` in a text is text.

    Besides those: ``unused`` (the fields and message keys no reader used), and where the record says so,
    ``flags`` / ``detail`` (per-turn training flags by message index, ``hf_lora_ds.data.masking.turn_flags``) and
    ``completion_from`` (the first message of a TRL completion). A plain-text record (TRL's standard kinds) is
    ``{"text", "prompt_chars", "messages": None, "tools": None}``: its text, and how much of it is prompt."""
    options = options or FormatOptions()
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    # A null field is an absent one: Arrow sources (parquet, save_to_disk, the Hub) give every row every column.
    record, names = map_columns({k: v for k, v in record.items() if v is not None}, options.columns, where)
    _refuse_foreign_fields(record, where, names, images)
    record_format = format_of(record)
    if record_format is None:
        raise DataError(f"{where}: missing field: a record needs {accepted_kinds()}; found fields {sorted(record)}")
    reading = Reading(where, names, options, images)
    conversation = record_format.convert(record, reading)
    messages = conversation["messages"]
    if system_prompt is not None and messages is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
        reading.shift(1)
    if images:
        conversation["images"] = _images(conversation, record, reading)
    conversation["unused"] = _unused(record, record_format.reads, names, reading.unused)
    conversation.update(reading.fields())
    return conversation


def to_messages(record: Any, system_prompt: str | None = None, where: str = "record") -> list[dict[str, Any]]:
    """The conversation of one record (any format), validated, without its tools: what an eval prompt needs."""
    conversation = to_conversation(record, where, system_prompt)
    if conversation["messages"] is None:
        raise DataError(
            f"{where}: a plain-text record (TRL's 'text' or string 'prompt'/'completion') has no chat turns to prompt "
            "a generation eval with; give the eval set as messages"
        )
    return conversation["messages"]


def _images(conversation: dict[str, Any], record: dict, reading: Reading) -> list[Any]:
    """The conversation's images in mark order; a plain-text record (no chat turns to place them in) may have none."""
    if conversation["messages"] is not None:
        return place_images(conversation["messages"], record, reading)
    if record.get("images") not in (None, []):
        raise DataError(
            f"{reading.where}: field '{reading.names['images']}': a plain-text record (TRL's 'text' or string "
            "'prompt'/'completion') has no chat turns to place images in; give it as messages"
        )
    return []


def _refuse_foreign_fields(record: dict, where: str, names: FieldNames, images: bool) -> None:
    if isinstance(record.get("label"), bool):  # TRL's KTO kind, LLaMA-Factory's kto_tag: a verdict on the answer
        raise DataError(
            f"{where}: field '{names['label']}': unpaired preference data (KTO), not SFT; drop the records labelled "
            "false and the field"
        )
    if REFUSED_FIELDS.keys().isdisjoint(record):  # most records: none of them
        return
    for name, what in REFUSED_FIELDS.items():
        if record.get(name) not in (None, "", [], {}) and not (images and name == "images"):
            raise DataError(
                f"{where}: field '{names[name]}' holds {what}, which cannot be trained on here; "
                "drop the field or the record"
            )


def _unused(record: dict, reads: frozenset[str], names: FieldNames, message_keys: list[str]) -> list[str]:
    """The record's fields its format does not read (named as the user wrote them), then its unused message keys."""
    if not (unread := record.keys() - reads) and not message_keys:
        return []
    return sorted(names[name] for name in unread) + sorted(set(message_keys))
