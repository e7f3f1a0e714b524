"""``python -m hf_lora_ds.run_sft`` (``torchrun -m``, ``deepspeed --module``): the training command,
hf_lora_ds.cli.run. Imported, its names are that module's."""

if __name__ == "__main__":
    from hf_lora_ds.command_process import run_command

    run_command("hf_lora_ds.cli.run")
else:
    from hf_lora_ds.cli.run import cli, main, parse_args

    __all__ = ["cli", "main", "parse_args"]
