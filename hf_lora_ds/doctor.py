"""``python -m hf_lora_ds.doctor``: the machine check, hf_lora_ds.cli.doctor. Imported, its names are that module's."""

if __name__ == "__main__":
    from hf_lora_ds.command_process import run_command

    run_command("hf_lora_ds.cli.doctor")
else:
    from hf_lora_ds.cli.doctor import cli, main

    __all__ = ["cli", "main"]
