import pytest
from transformers import HfArgumentParser

from hf_lora_ds.config.reliability import ReliabilityArguments


def test_the_guards_take_only_their_choices():
    parser = HfArgumentParser(ReliabilityArguments)
    (args,) = parser.parse_args_into_dataclasses(["--on_nonfinite", "skip", "--on_divergence", "stop"])
    assert (args.on_nonfinite, args.on_divergence, args.resume_from_checkpoint) == ("skip", "stop", None)
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--on_nonfinite", "ignore"])
