"""Build the bundled vision demo base ``data/tiny-vlm/``: a Qwen2.5-VL-shaped model whose language model is the text
demo's pre-trained base and whose vision tower and projector are random (and stay frozen in the demo).

The vision demo (``data/shapes``, ``scripts/make_shapes.py``) asks LoRA on the language model to answer "Which colour
is the square?" about an image. LoRA on a random language model cannot do it in a few CPU minutes (the loss of a
random hidden-32 model stayed at ~5.5 over 60 steps, measured): a base must already speak the chat template and end
its turn. So the language model here is ``data/tiny-qwen2-sum`` (a Qwen2 chat model, pre-trained by
``build_tiny_model.py``) carried over weight for weight: Qwen2.5-VL's text model is Qwen2's with multimodal rotary
positions, which equal plain 1-D positions on text, so on a text prompt the built model gives the text base's logits.
The image tokens (``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``) are new rows of the
(tied) embedding, set to the mean of the others. The tower (2 blocks, width 32) and the projector are random: the
demo shows what LoRA learns to read from a frozen tower's features. The processor (tokenizer, PIL image processor,
chat template) is ``hf_lora_ds._testing.tiny_vlms``'s Qwen2.5-VL one: a 64 x 64 image is 4 image tokens.

    PYTHONPATH=. python scripts/make_shapes.py && PYTHONPATH=. python scripts/build_tiny_vlm.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel, ProcessorMixin

from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm
from hf_lora_ds.resources import DEMO_MODEL
from hf_lora_ds.vision.processor import save_processor

__all__ = ["FAMILY", "build", "main"]

OUT_DIR = Path(__file__).resolve().parents[1] / "hf_lora_ds" / "resources" / "demo" / "tiny-vlm"
FAMILY = "qwen2_5_vl"
_TEXT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "layer_types",
)


def build(seed: int = 0, text_base: str | Path = DEMO_MODEL) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The demo VLM and its processor: ``text_base``'s weights in the language model, a random tower (``seed``)."""
    tiny, processor = build_tiny_vlm(FAMILY, seed)
    base = AutoModelForCausalLM.from_pretrained(text_base, dtype=torch.float32)
    fields = tiny.config.to_dict()
    text = fields["text_config"]
    text.update({name: getattr(base.config, name) for name in _TEXT_FIELDS})
    head_dim = base.config.hidden_size // base.config.num_attention_heads
    half = head_dim // 2  # temporal, height, width sections of the rotary frequencies: they sum to half a head
    text["rope_parameters"] = {
        **base.config.rope_parameters,
        "type": "mrope",
        "mrope_section": [half - 2 * (half // 3), half // 3, half // 3],
    }
    fields["vision_config"]["out_hidden_size"] = base.config.hidden_size
    fields["tie_word_embeddings"] = base.config.tie_word_embeddings
    config = type(tiny.config).from_dict(fields)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    _carry_language_model(base, model)
    model.generation_config = tiny.generation_config
    return model.eval(), processor


@torch.no_grad()
def _carry_language_model(base: PreTrainedModel, model: PreTrainedModel) -> None:
    """``base``'s decoder into ``model``'s language model; the embedding's extra rows (image tokens) the mean row."""
    language_model = model.model.language_model
    weights = base.model.state_dict()
    embedding = weights.pop("embed_tokens.weight")
    missing, unexpected = language_model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) != {"embed_tokens.weight"}:
        raise RuntimeError(f"the text base does not fit the language model: missing {missing}, extra {unexpected}")
    rows = language_model.embed_tokens.weight
    rows[: len(embedding)] = embedding
    rows[len(embedding) :] = embedding.mean(dim=0)
    if not model.config.tie_word_embeddings:
        model.lm_head.weight.copy_(rows)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", type=Path, default=OUT_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model, processor = build(args.seed)
    model.save_pretrained(args.out_dir)
    save_processor(processor, args.out_dir)
    print(f"wrote {args.out_dir} ({sum(p.numel() for p in model.parameters()):,} parameters)")
    return args.out_dir


if __name__ == "__main__":
    main()
