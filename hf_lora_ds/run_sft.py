"""``python -m hf_lora_ds.run_sft`` (``torchrun -m``, ``deepspeed --module``): the training command,
hf_lora_ds.cli.run."""

from hf_lora_ds.cli.run import cli, main, parse_args

__all__ = ["cli", "main", "parse_args"]

if __name__ == "__main__":
    cli()
