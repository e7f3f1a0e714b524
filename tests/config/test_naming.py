"""hf_lora_ds.config.naming: a refusal names a field as its values were given, ``--name value`` from a command line
and ``name="value"`` from code."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hf_lora_ds.config.naming import as_field, from_command_line, in_code_terms, named_as_given
from hf_lora_ds.errors import MissingPathError, UserError

VALUES = SimpleNamespace(lora_optimizer="lorafa", load_in_4bit=True, sequence_parallel_size=3, fsdp="")


def test_a_field_is_written_as_python_writes_its_value():
    assert as_field("lora_optimizer", "lorafa") == 'lora_optimizer="lorafa"'
    assert as_field("sequence_parallel_size", 3) == "sequence_parallel_size=3"
    assert as_field("load_in_4bit", True) == "load_in_4bit=True"


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        ("--lora_optimizer lorafa with ZeRO stage 2", 'lora_optimizer="lorafa" with ZeRO stage 2'),
        ("--sequence_parallel_size 3: heads", "sequence_parallel_size=3: heads"),
        ("--load_in_4bit with a config", "load_in_4bit=True with a config"),
        ("--fsdp and --deepspeed x", "fsdp and --deepspeed x"),  # deepspeed: no field of these values
        ("use --lora_optimizer loraplus", "use lora_optimizer loraplus"),  # another value than the field's
    ],
)
def test_in_code_each_flag_of_a_field_becomes_the_field(flags, code):
    assert in_code_terms(flags, VALUES) == code


def test_a_refusal_keeps_its_kind_and_the_flags_from_a_command_line():
    with pytest.raises(MissingPathError, match='^lora_optimizer="lorafa": gone$'), named_as_given(VALUES):
        raise MissingPathError("--lora_optimizer lorafa: gone")
    with pytest.raises(UserError, match="^--lora_optimizer lorafa: bad$"), from_command_line(), named_as_given(VALUES):
        raise ValueError("--lora_optimizer lorafa: bad")  # a library's ValueError is a bad value: one line
    with pytest.raises(UserError, match='^lora_optimizer="lorafa": bad$'), named_as_given(VALUES):
        raise UserError("--lora_optimizer lorafa: bad")  # the command line's naming ended with its block
