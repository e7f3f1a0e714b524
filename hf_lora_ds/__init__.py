"""hf_lora_ds: LoRA supervised fine-tuning of chat LLMs with Hugging Face Trainer and DeepSpeed."""
