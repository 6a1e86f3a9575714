"""CLI errors that need no grading: unreachable broker, bad paths, exit codes, help."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from producer.cli import cli, main
from producer.errors import (
    BrokerUnavailableError,
    DeadlinePassedError,
    InvalidRolloutError,
    MalformedInputError,
    ProducerError,
)
from producer.settings import ProducerSettings, default_cache_dir
from tests.helpers import free_port


def _closed_port_url() -> str:
    return f"redis://:s3cret@127.0.0.1:{free_port()}/0"


def test_cli_exit_codes_are_distinct() -> None:
    codes = {
        cls.__name__: cls.exit_code
        for cls in (
            ProducerError,
            InvalidRolloutError,
            MalformedInputError,
            BrokerUnavailableError,
            DeadlinePassedError,
        )
    }
    assert codes == {
        "ProducerError": 1,
        "InvalidRolloutError": 4,
        "MalformedInputError": 3,
        "BrokerUnavailableError": 5,
        "DeadlinePassedError": 6,
    }
    assert 2 not in codes.values()  # click's usage error


def test_cli_status_unreachable_broker_is_a_clear_error() -> None:
    # Given a broker URL where nothing listens
    url = _closed_port_url()
    # When status runs
    result = CliRunner().invoke(cli, ["status", "--broker", url, "--timeout-s", "0.5"])
    # Then it exits 5 with one line naming the broker, password hidden, no traceback
    assert result.exit_code == BrokerUnavailableError.exit_code, result.output
    assert "cannot reach the broker" in result.stderr
    assert "***" in result.stderr
    assert "s3cret" not in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_grade_unreachable_broker_from_env_exits_5(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"response": "\\\\boxed{4}", "gold": "4"}\n')
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        cli,
        ["grade", str(source), "-o", str(out)],
        env={"GRADEFLEET_BROKER_URL": _closed_port_url()},
    )
    assert result.exit_code == BrokerUnavailableError.exit_code, result.output
    assert "unreachable" in result.stderr
    assert not out.exists()  # nothing half-written


def test_cli_main_maps_errors_to_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--broker", _closed_port_url(), "--timeout-s", "0.5"])
    assert exit_info.value.code == 5
    err = capsys.readouterr().err
    assert err.startswith("Error: cannot reach the broker")
    assert "Traceback" not in err


def test_cli_status_without_broker_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["status"], env={"GRADEFLEET_BROKER_URL": ""})
    assert result.exit_code == 2
    assert "--broker" in result.stderr


def test_cli_grade_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["grade", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")]
    )
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_cli_grade_missing_output_directory_is_a_usage_error(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("")
    result = CliRunner().invoke(
        cli, ["grade", str(source), "-o", str(tmp_path / "no" / "such" / "o.jsonl")]
    )
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_cli_help_lists_commands_and_env() -> None:
    result = CliRunner().invoke(cli, ["grade", "--help"])
    assert result.exit_code == 0
    for text in ("GRADEFLEET_BROKER_URL", "--batch-size", "--no-cache", "reward_model"):
        assert text in result.output
    top = CliRunner().invoke(cli, ["--help"])
    for command in ("grade", "status", "worker"):
        assert command in top.output


def test_cli_settings_fields_are_cli_options_with_envvars_and_defaults() -> None:
    # The CLI is the one reader of the producer's GRADEFLEET_* variables: every
    # ProducerSettings field is an option with its env var and the same default.
    command = cli.commands["grade"]
    params = {p.name: p for p in command.params}
    renamed = {"broker_url": "broker"}
    for field in dataclasses.fields(ProducerSettings):
        if field.name == "cache_dir":
            continue  # --cache-dir / --no-cache, default from default_cache_dir()
        if field.name == "keyring":
            continue  # a secret: GRADEFLEET_SIGNING_KEY(_FILE) only, never argv
        param = params[renamed.get(field.name, field.name)]
        assert param.envvar == f"GRADEFLEET_{field.name.upper()}", field.name
        if field.default is not None:  # click leaves an unset default as a sentinel
            assert param.default == field.default, field.name
    assert params["cache_dir"].envvar == "GRADEFLEET_CACHE_DIR"
    assert params["no_cache"].envvar == "GRADEFLEET_NO_CACHE"


def test_cli_settings_default_cache_dir_follows_xdg() -> None:
    assert default_cache_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/gradefleet")
    assert default_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/gradefleet")


def test_cli_grade_env_var_of_wrong_type_is_a_usage_error(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("")
    result = CliRunner().invoke(
        cli,
        ["grade", str(source), "-o", str(tmp_path / "o")],
        env={"GRADEFLEET_BATCH_SIZE": "many"},
    )
    assert result.exit_code == 2
    assert "batch-size" in result.stderr


def test_cli_worker_passes_every_argument_through() -> None:
    # `--help` goes to the worker's own parser, not to click.
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0, result.output
    assert "usage: gradefleet worker" in result.output
    assert "--item-timeout-s" in result.output
    bad = CliRunner().invoke(cli, ["worker", "--no-such-option"])
    assert bad.exit_code == 2
    assert "unrecognized arguments: --no-such-option" in bad.stderr


def test_cli_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="batch_size, deadline_s"):
        ProducerSettings(batch_size=0, deadline_s=0)


def test_cli_grade_rejects_bad_option_values(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("")
    for option, value in (("--batch-size", "0"), ("--item-timeout-s", "0")):
        result = CliRunner().invoke(
            cli, ["grade", str(source), "-o", str(tmp_path / "o"), option, value]
        )
        assert result.exit_code == 2, (option, result.output)
