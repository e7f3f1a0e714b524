"""``python -m hf_lora_ds.eval``: the eval command, hf_lora_ds.cli.eval."""

from hf_lora_ds.cli.eval import main
from hf_lora_ds.errors import run_cli

run_cli(main)
