"""Vision-language models: images in chat records, trained with LoRA on the language model.

The pipeline, a module each: ``images`` opens what a record refers to, ``resolution`` bounds its pixels once,
``processor`` builds, saves and reloads a model's processor (also where torchvision is missing), ``encoding`` turns
image records into the processor's tokens with the text rule's exact labels, ``collator`` adds each batch's pixels,
``packing`` gives Qwen-VL's packed rows their per-sample rotary positions, ``token_count`` counts an image's tokens
from its size alone (for the planner), ``modules`` finds the language model, tower and projector and decides what
trains.
"""
