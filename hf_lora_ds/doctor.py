"""``python -m hf_lora_ds.doctor``: the machine check, hf_lora_ds.cli.doctor."""

from hf_lora_ds.cli.doctor import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    cli()
