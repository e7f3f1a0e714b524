"""``python -m hf_lora_ds.merge``: the merge and export command, hf_lora_ds.cli.merge."""

from hf_lora_ds.cli.merge import main

__all__ = ["main"]

if __name__ == "__main__":
    from hf_lora_ds.errors import run_cli

    run_cli(main)
