import pytest
from transformers import HfArgumentParser

from hf_lora_ds.config.reporting import RUN_CALLBACKS, ReportingArguments, chosen_callbacks
from hf_lora_ds.errors import UserError


def test_the_reporting_defaults():
    (args,) = HfArgumentParser(ReportingArguments).parse_args_into_dataclasses([])
    assert (args.eval_task, args.project, args.run_name) == ("sum_to_x", "huggingface", None)


def test_code_gets_no_run_callbacks_unless_named_and_the_command_line_all_of_them():
    from hf_lora_ds.resources import DEMO_ARGUMENTS

    (args,) = HfArgumentParser(ReportingArguments).parse_args_into_dataclasses([])
    assert chosen_callbacks(args.run_callbacks) == ()  # no signal handler in a caller's process unless asked
    assert chosen_callbacks(DEMO_ARGUMENTS["run_callbacks"]) == RUN_CALLBACKS  # run_sft's defaults
    assert chosen_callbacks("report, memory") == ("memory", "report")  # the run's order


def test_an_unknown_callback_name_is_one_line():
    with pytest.raises(UserError, match=r"--run_callbacks memory,sigterm: unknown \['sigterm'\]"):
        chosen_callbacks("memory,sigterm")
