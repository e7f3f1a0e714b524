"""``python -m hf_lora_ds.audit``: the mask audit command, hf_lora_ds.cli.audit."""

from hf_lora_ds.cli.audit import main

__all__ = ["main"]

if __name__ == "__main__":
    from hf_lora_ds.errors import run_cli

    run_cli(main)
