"""``python -m hf_lora_ds.eval``: the eval command, hf_lora_ds.cli.eval."""

from hf_lora_ds.command_process import run_command

run_command("hf_lora_ds.cli.eval")
