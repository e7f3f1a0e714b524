"""The CLI error boundary: a UserError is one line and exit code 2, a bug keeps its traceback."""

from __future__ import annotations

import sys

import pytest

from hf_lora_ds.errors import USER_ERROR_EXIT_CODE, MissingPathError, UserError, run_cli
from tests.cli.test_log import WriteRecorder


def _fail(error: BaseException):
    def main():
        raise error

    return main


def test_user_error_is_one_line_and_exit_code_2(capsys, monkeypatch):
    monkeypatch.delenv("HF_LORA_DS_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exited:
        run_cli(_fail(UserError("data.jsonl, line 3: bad\n  fix it")))
    assert exited.value.code == USER_ERROR_EXIT_CODE == 2
    captured = capsys.readouterr()
    assert captured.err == "error: data.jsonl, line 3: bad fix it\n"
    assert captured.out == ""


def test_the_error_line_is_one_write(monkeypatch):
    """With its newline: another rank's output written between the two would end up on the error's line."""
    monkeypatch.delenv("HF_LORA_DS_DEBUG", raising=False)
    monkeypatch.setattr(sys, "stderr", stderr := WriteRecorder())
    with pytest.raises(SystemExit):
        run_cli(_fail(UserError("data.jsonl, line 3: bad")))
    assert stderr.writes == ["error: data.jsonl, line 3: bad\n"]


def test_missing_path_is_a_user_error_and_still_a_file_not_found_error(capsys):
    with pytest.raises(SystemExit) as exited:
        run_cli(_fail(MissingPathError("--train_file x.json: no such file")))
    assert exited.value.code == 2
    assert issubclass(MissingPathError, FileNotFoundError)


def test_other_ranks_print_late_and_name_their_rank(capsys, monkeypatch):
    """Rank 0 prints at once; another rank waits first (a launcher ends it as soon as rank 0 exits with the same
    error, so rank 0's line is the only one), and prints an error of its own, prefixed with its rank."""
    import hf_lora_ds.errors

    waited = []
    monkeypatch.setattr(hf_lora_ds.errors.time, "sleep", waited.append)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exited:
        run_cli(_fail(UserError("a disk full on this rank only")))
    assert exited.value.code == 2
    assert waited == [hf_lora_ds.errors._OTHER_RANKS_GRACE_S] and waited[0] > 0
    assert capsys.readouterr().err == "error: (rank 1) a disk full on this rank only\n"


def test_debug_variable_keeps_the_traceback(monkeypatch):
    monkeypatch.setenv("HF_LORA_DS_DEBUG", "1")
    with pytest.raises(UserError, match="shown in full"):
        run_cli(_fail(UserError("shown in full")))


def test_a_bug_keeps_its_traceback():
    with pytest.raises(KeyError):
        run_cli(_fail(KeyError("not a user error")))


@pytest.mark.parametrize(("result", "code"), [(0, 0), (3, 3), ({"after": 1.0}, 0), (None, 0)])
def test_exit_code_is_mains_int_result(result, code):
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: result)
    assert exited.value.code == code


@pytest.mark.parametrize("code", [75, 0])
def test_a_launched_rank_leaving_with_system_exit_skips_teardown_too(code, monkeypatch):
    """A preempted run raises SystemExit(75): in a launched rank it must leave through exit_launched_rank like any
    other end (an interpreter teardown aborted a preempted ZeRO-3 rank: SIGABRT instead of 75)."""
    import hf_lora_ds.errors

    left = []

    def leave(exit_code):
        left.append(exit_code)
        raise SystemExit(exit_code)

    monkeypatch.setattr(hf_lora_ds.errors, "exit_launched_rank", leave)
    with pytest.raises(SystemExit):
        run_cli(_fail(SystemExit(code)))
    assert left == [code]


def test_a_system_exit_with_a_message_is_left_alone(monkeypatch):
    import hf_lora_ds.errors

    monkeypatch.setattr(hf_lora_ds.errors, "exit_launched_rank", lambda code: pytest.fail("not an exit code"))
    with pytest.raises(SystemExit, match="usage"):
        run_cli(_fail(SystemExit("usage: ...")))


@pytest.mark.parametrize(("world_size", "watched"), [(None, False), ("2", True), ("3", True)])
def test_every_launched_rank_starts_the_error_relay(no_launcher, world_size, watched):
    """Rank 0 watches for, and the others attach to publish, an error one rank alone hits: in a 2-rank launch too."""
    import hf_lora_ds.errors

    started = []
    no_launcher.setattr(hf_lora_ds.errors.ErrorRelay, "start", lambda relay, say, leave: started.append(relay))
    no_launcher.setattr(hf_lora_ds.errors, "exit_launched_rank", sys.exit)  # a launched rank would leave by os._exit
    if world_size:
        no_launcher.setenv("WORLD_SIZE", world_size)
    with pytest.raises(SystemExit):
        run_cli(lambda: 0)
    assert len(started) == watched
