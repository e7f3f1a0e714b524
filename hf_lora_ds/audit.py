"""``python -m hf_lora_ds.audit``: the mask audit command, hf_lora_ds.cli.audit.
Imported, its names are that module's."""

if __name__ == "__main__":
    from hf_lora_ds.command_process import run_command

    run_command("hf_lora_ds.cli.audit")
else:
    from hf_lora_ds.cli.audit import main

    __all__ = ["main"]
