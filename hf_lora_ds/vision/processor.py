"""Build, save and reload a vision-language model's processor, with or without torchvision.

transformers builds a processor that has a video slot (Qwen-VL, SmolVLM, LLaVA-OneVision, InternVL) only with a video
processor, and a video processor only where torchvision imports: without it, ``VIDEO_PROCESSOR_MAPPING`` cannot
resolve the class, the constructor's type check fails on ``video_processor=None`` and ``save_pretrained`` fails on the
missing video processor. Image training needs none of the video code, so the package builds the processor class
without its video processor (``make_processor``), and saves and reloads its parts itself in the layout transformers'
``AutoProcessor`` also reads: tokenizer files, ``preprocessor_config.json`` (the image processor),
``chat_template.jinja`` and ``processor_config.json`` (the processor's own settings). Where torchvision imports,
``load_processor`` is transformers' own ``AutoProcessor``, which builds the video processor from the model's defaults.
"""

from __future__ import annotations

import inspect
import json
from functools import cache
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, ProcessorMixin
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.utils import is_torchvision_available

from hf_lora_ds.errors import UserError

__all__ = ["NoVideoProcessor", "make_processor", "load_processor", "save_processor"]

PROCESSOR_CONFIG = "processor_config.json"
IMAGE_PROCESSOR_CONFIG = "preprocessor_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
LEGACY_CHAT_TEMPLATE_FILE = "chat_template.json"
# The processor's sub-processors, saved in files of their own rather than in processor_config.json.
_PARTS = ("image_processor", "video_processor", "tokenizer", "feature_extractor")


def make_processor(
    processor_class: type[ProcessorMixin],
    image_processor: Any,
    tokenizer: Any,
    chat_template: str | None = None,
    **kwargs: Any,
) -> ProcessorMixin:
    """``processor_class`` built from its image processor and tokenizer; a class with a video slot is built without
    its video processor unless ``kwargs`` has one (without torchvision none can be built)."""
    if "video_processor" in inspect.signature(processor_class.__init__).parameters and "video_processor" not in kwargs:
        processor_class = _without_video(processor_class)
        kwargs = {**kwargs, "video_processor": None}  # some classes (SmolVLM's) have it without a default
    return processor_class(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **kwargs)


class NoVideoProcessor:
    """Stands in for the video processor that cannot be built without torchvision: its settings read as None
    (SmolVLM's ``apply_chat_template`` reads ``num_frames`` and ``fps`` even with no video), and videos are refused."""

    num_frames = None
    fps = None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise UserError(
            "this processor was built without its video processor (videos need torchvision): it takes images and text"
        )


@cache
def _without_video(processor_class: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """A subclass of the same name that accepts ``video_processor=None`` and has no video processor to save or
    load (a ``NoVideoProcessor`` in its place); everything else (prompt expansion, ``apply_chat_template``,
    ``__call__``) is the class's own."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return processor_class.check_argument_for_proper_class(self, argument_name, argument)

    def get_attributes(cls) -> list[str]:
        # The classes pass their sub-processors to ProcessorMixin in this order, the video processor last: with it
        # left out, the None passed in its place is dropped.
        return [name for name in processor_class.get_attributes() if name != "video_processor"]

    return type(
        processor_class.__name__,
        (processor_class,),
        {
            "check_argument_for_proper_class": check_argument_for_proper_class,
            "get_attributes": classmethod(get_attributes),
            "video_processor": NoVideoProcessor(),
            "__module__": processor_class.__module__,
            "__doc__": f"{processor_class.__name__} without its video processor: images and text only.",
        },
    )


def save_processor(processor: ProcessorMixin, out_dir: str | Path) -> None:
    """Write ``processor``'s tokenizer, image processor (``preprocessor_config.json``), chat template and own settings
    (``processor_config.json``) into ``out_dir``; a video processor, where there is one, is left to the model's
    defaults, as a checkpoint with none saved is loaded by transformers."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(out_dir)
    processor.image_processor.save_pretrained(out_dir)
    if isinstance(processor.chat_template, str):
        (out_dir / CHAT_TEMPLATE_FILE).write_text(processor.chat_template, encoding="utf-8")
    settings = {key: value for key, value in processor.to_dict().items() if key not in _PARTS}
    (out_dir / PROCESSOR_CONFIG).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_processor(path: str | Path) -> ProcessorMixin | None:
    """The processor saved in ``path``, or None where it has no image processor (a text-only model).

    transformers' ``AutoProcessor`` where torchvision imports; else the processor class built without its video
    processor from the saved tokenizer, image processor (its PIL class), chat template and settings. A family whose
    image processor or processor needs torchvision (LFM2-VL's, Pixtral's) is refused in one line.
    """
    path = Path(path)
    settings = _read_json(path / PROCESSOR_CONFIG)
    if not (path / IMAGE_PROCESSOR_CONFIG).is_file() and "image_processor" not in settings:
        return None
    if is_torchvision_available():
        return AutoProcessor.from_pretrained(path)
    processor_class = _processor_class(path, settings)
    try:
        image_processor = AutoImageProcessor.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        kwargs = {key: value for key, value in settings.items() if key not in (*_PARTS, "processor_class", "auto_map")}
        return make_processor(processor_class, image_processor, tokenizer, _chat_template(path, tokenizer), **kwargs)
    except (ImportError, ValueError) as err:
        if "torchvision" not in str(err).lower():
            raise
        raise UserError(
            f"{path}: {processor_class.__name__} needs torchvision for its images, and torchvision does not import "
            f"here; install the torchvision build that matches torch {torch.__version__}"
        ) from err


def _read_json(file: Path) -> dict:
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}


def _processor_class(path: Path, settings: dict) -> type[ProcessorMixin]:
    """The processor class the checkpoint names (processor_config.json, else preprocessor_config.json as older
    checkpoints have it), else the one transformers maps its model_type to."""
    name = settings.get("processor_class") or _read_json(path / IMAGE_PROCESSOR_CONFIG).get("processor_class")
    model_type = _read_json(path / "config.json").get("model_type")
    name = name or PROCESSOR_MAPPING_NAMES.get(model_type or "")
    if not name or not hasattr(transformers, name):
        raise UserError(f"{path}: no processor class named in processor_config.json and none known for {model_type}")
    return getattr(transformers, name)


def _chat_template(path: Path, tokenizer: Any) -> str | None:
    """The processor's chat template: chat_template.jinja, else the older chat_template.json, else the tokenizer's."""
    if (path / CHAT_TEMPLATE_FILE).is_file():
        return (path / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    return _read_json(path / LEGACY_CHAT_TEMPLATE_FILE).get("chat_template") or tokenizer.chat_template
