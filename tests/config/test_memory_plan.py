from transformers import HfArgumentParser

from hf_lora_ds.config.memory_plan import MemoryPlanArguments


def test_the_plan_flags_parse():
    (args,) = HfArgumentParser(MemoryPlanArguments).parse_args_into_dataclasses(
        ["--device_memory", "24GiB", "--check_memory_plan", "false"]
    )
    assert (args.device_memory, args.check_memory_plan) == ("24GiB", False)
