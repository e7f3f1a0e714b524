"""The model side of a run: loading the tokenizer and base (``loading``, ``source``, GGUF files in ``gguf_import``,
bitsandbytes in ``quantization``), LoRA (``lora``, where the adapters land: ``lora_coverage``), the saved adapter's
check (``adapter_check``), and the way out: ``merge_adapter`` and ``gguf_export``.

Imports nothing of the data, training or launch layers."""
