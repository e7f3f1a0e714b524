from transformers import HfArgumentParser

from hf_lora_ds.config.reporting import ReportingArguments


def test_the_reporting_defaults():
    (args,) = HfArgumentParser(ReportingArguments).parse_args_into_dataclasses([])
    assert (args.eval_task, args.project, args.run_name) == ("sum_to_x", "huggingface", None)
