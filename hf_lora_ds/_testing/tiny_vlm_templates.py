"""Chat templates of the vision-language families, as their checkpoints write conversations, without the hub.

Each is its family's real template cut down to what training reads: the turns as the real one renders them, an
end-of-turn token after each reply, and an image part (``{"type": "image"}``) written as the real one writes it, for
the processor to expand into the image's tokens. A message's content may also be a string (a record's text with its
image placeholders already in it). Where a hub template's generation prompt is not a prefix of the turn it renders,
or it ends no turn, the difference is said where the template is defined.
"""

from __future__ import annotations

__all__ = ["TEMPLATES"]

# The text parts of a message: its content when that is a string (a record's text with its image marks), else the
# text of each part in order, with each image part written as the family writes one.
_CONTENT = (
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- IMAGE }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
)

# ChatML, as Qwen2-VL, Qwen2.5-VL, Qwen3-VL, InternVL and LLaVA-OneVision write it; an image part is written by IMAGE.
_CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}" + _CONTENT + "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2-VL and Qwen2.5-VL add a default system turn; Qwen3-VL does not.
_QWEN2_VL_SYSTEM = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
)
# SmolVLM and Idefics3: "User:<image>text<end_of_utterance>\nAssistant: reply<end_of_utterance>\n", after a BOS;
# the colon is followed by a space unless the turn starts with an image.
_IDEFICS = (
    "{{- BOS }}{%- for message in messages %}"
    "{{- message['role'] | capitalize }}"
    "{%- if message['content'] is not string and message['content'][0]['type'] == 'image' %}{{- ':' }}"
    "{%- else %}{{- ': ' }}{%- endif %}" + _CONTENT + "{{- '<end_of_utterance>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}"
)
# Gemma 3: a system turn is prepended to the first user turn, the assistant is "model"; the image is written as
# <start_of_image>, which the processor expands into its soft tokens.
_GEMMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}"
    "{%- set system = system if system is string else system[0]['text'] %}"
    "{%- set first_user_prefix = system + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    + _CONTENT
    + "{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
# LLaVA-1.5 (Vicuna): "USER: <image>\ntext ASSISTANT: reply</s>". The hub template ends no turn; Vicuna's </s> after
# each reply is what the model was trained to stop on.
_LLAVA = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}" + _CONTENT + "{{- ' ' }}"
    "{%- elif message['role'] == 'assistant' %}{{- 'ASSISTANT: ' }}" + _CONTENT + "{{- eos_token }}"
    "{%- else %}{{- message['role'].upper() + ': ' }}" + _CONTENT + "{{- ' ' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'ASSISTANT:' }}{%- endif %}"
)


def _template(shape: str, image: str, bos: str = "") -> str:
    """``shape`` with its image part written as ``image`` (and its BOS as ``bos``), as jinja string literals."""
    return shape.replace("IMAGE", repr(image)).replace("BOS", repr(bos))


# LLaVA-OneVision's hub template writes "role " then the images then "\n" + text, but its generation prompt is
# "assistant\n", which is not a prefix of the turn it renders; ChatML's newline is written in both here.
TEMPLATES = {
    "qwen2_5_vl": _QWEN2_VL_SYSTEM + _template(_CHATML, "<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen2_vl": _QWEN2_VL_SYSTEM + _template(_CHATML, "<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen3_vl": _template(_CHATML, "<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen3_vl_moe": _template(_CHATML, "<|vision_start|><|image_pad|><|vision_end|>"),
    "internvl": _template(_CHATML, "<IMG_CONTEXT>\n"),
    "llava_onevision": _template(_CHATML, "<image>\n"),
    "llava_next": _template(_CHATML, "<image>\n"),
    "smolvlm": _template(_IDEFICS, "<image>", bos="<|im_start|>"),
    "idefics3": _template(_IDEFICS, "<image>", bos="<|begin_of_text|>"),
    "gemma3": _template(_GEMMA3, "<start_of_image>"),
    "llava": _template(_LLAVA, "<image>\n"),
}
