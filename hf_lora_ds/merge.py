"""``python -m hf_lora_ds.merge``: the merge and export command, hf_lora_ds.cli.merge.
Imported, its names are that module's."""

if __name__ == "__main__":
    from hf_lora_ds.command_process import run_command

    run_command("hf_lora_ds.cli.merge")
else:
    from hf_lora_ds.cli.merge import main

    __all__ = ["main"]
