"""Coordinator configuration: TOML, then environment, then flags; clear errors; full --help."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from rollnet.reference.cli import build_parser
from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator.config import (
    ENV_PREFIX,
    OPTIONS,
    ConfigError,
    load_config,
    with_overrides,
    write_threads,
)

TOML = """
network_id = "from-toml"
max_attempts = 5
lease_duration = 300
heartbeat_interval = 7.5
operators = ["AA00AA00AA00AA00AA00AA00AA00AA00"]
validators = ["bb11bb11bb11bb11bb11bb11bb11bb11"]

[pools.private]
invite_tokens = ["sesame", "open"]
"""


def _flags(**values: object) -> dict[str, object]:
    """What argparse hands the loader: every option present, None unless given."""
    flags: dict[str, object] = {option.name: None for option in OPTIONS}
    flags.update(values)
    return flags


def test_flag_beats_environment_beats_toml_beats_default(tmp_path: Path) -> None:
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(TOML)
    environ = {
        f"{ENV_PREFIX}NETWORK_ID": "from-env",
        f"{ENV_PREFIX}MAX_ATTEMPTS": "6",
        "UNRELATED": "ignored",
    }
    config = load_config(
        tmp_path,
        config_file=config_file,
        environ=environ,
        flags=_flags(network_id="from-flag"),
    )
    assert config.network_id == "from-flag"  # flag > env > TOML
    assert config.max_attempts == 6  # env > TOML
    assert config.lease_duration == timedelta(seconds=300)  # TOML > default
    assert config.heartbeat_interval == timedelta(seconds=7.5)
    assert config.max_leases_per_node == 4  # default
    assert config.operators == frozenset(
        {"aa00aa00aa00aa00aa00aa00aa00aa00"}
    )  # hex ids are case-insensitive
    assert config.validators == frozenset({"bb11bb11bb11bb11bb11bb11bb11bb11"})
    assert config.pools["private"].invite_tokens == frozenset({"sesame", "open"})
    assert config.pools[""].invite_only is False

    # Without environ the library never reads the process environment.
    untouched = load_config(tmp_path, config_file=config_file)
    assert untouched.network_id == "from-toml"
    assert untouched.max_attempts == 5


def test_unknown_key_and_bad_values_are_clear_errors(tmp_path: Path) -> None:
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text('network_id = "x"\nlease_durations = 30\n')
    with pytest.raises(ConfigError, match=r"unknown key 'lease_durations'") as error:
        load_config(tmp_path, config_file=config_file)
    assert str(config_file) in str(error.value)
    assert "lease_duration" in str(error.value)  # the known keys are listed

    config_file.write_text("max_attempts = 0\n")
    with pytest.raises(ConfigError, match=r"max_attempts = 0: must be positive"):
        load_config(tmp_path, config_file=config_file)

    with pytest.raises(ConfigError, match=f"{ENV_PREFIX}SUSPECT_AFTER_MISSED"):
        load_config(tmp_path, environ={f"{ENV_PREFIX}SUSPECT_AFTER_MISSED": "often"})

    config_file.write_text("[pools.vip]\ninvite_tokens = [1]\n")
    with pytest.raises(ConfigError, match=r"pools.vip.invite_tokens"):
        load_config(tmp_path, config_file=config_file)

    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        load_config(tmp_path, flags=_flags(tls_cert="cert.pem"))

    # The blob cache's bound; 0 keeps no blob in memory.
    assert load_config(tmp_path).blob_cache_bytes == 64 << 20
    assert load_config(tmp_path, flags=_flags(blob_cache_bytes="0")).blob_cache_bytes == 0

    # The compute dtype from every source, and from code (with_overrides) too.
    with pytest.raises(ConfigError, match=f"{ENV_PREFIX}COMPUTE_DTYPE: .*'fp16' is not a"):
        load_config(tmp_path, environ={f"{ENV_PREFIX}COMPUTE_DTYPE": "fp16"})
    config = load_config(tmp_path, flags=_flags(compute_dtype="bfloat16"))
    assert config.compute_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="compute_dtype: 'float16' is not a compute dtype"):
        with_overrides(config, compute_dtype="float16")


def test_cli_reports_config_errors_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text("colour = 'blue'\n")
    code = cli_main(["coordinator", "--data-dir", str(tmp_path), "--config", str(config_file)])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown key 'colour'" in err
    assert len(err.splitlines()) == 1  # one line on stderr, no traceback


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["coordinator", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for required in ("--data-dir", "--config", "--db"):
        assert required in text
    for option in OPTIONS:
        flag = "--db" if option.name == "database_url" else option.flag
        assert flag in text, f"{flag} missing from --help"
        assert option.env in text, f"{option.env} missing from --help"
        assert option.help.split("(")[0].strip() in text
    # The allow-lists and the other keys only the TOML file sets, and where a sample is.
    for toml_only in ("validators =", "trainers", "operators", "environments", "[pools.NAME]"):
        assert toml_only in text
    assert "docs/coordinator.toml" in text


def test_environment_and_sampling_settings_come_from_toml(tmp_path: Path) -> None:
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        'environments = ["arithmetic"]\nmax_new_tokens = 64\nmax_samples_per_prompt = 8\n'
        "max_temperature = 1.5\n"
    )
    config = load_config(tmp_path / "data", config_file=config_file)
    assert config.environments == frozenset({"arithmetic"})
    assert (config.max_new_tokens, config.max_samples_per_prompt) == (64, 8)
    assert config.max_temperature == 1.5
    config_file.write_text("environments = 3\n")
    with pytest.raises(ConfigError, match="environments must be a list"):
        load_config(tmp_path / "data", config_file=config_file)


def test_postgres_write_threads_default_to_cores_plus_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert write_threads(load_config(tmp_path)) == 3
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert write_threads(load_config(tmp_path)) == 8
    chosen = load_config(tmp_path, environ={f"{ENV_PREFIX}DATABASE_WRITE_THREADS": "5"})
    assert write_threads(chosen) == 5
    with pytest.raises(ConfigError, match="database_write_threads"):
        load_config(tmp_path, flags=_flags(database_write_threads="-1"))


SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "coordinator.toml"


def test_the_sample_configuration_loads_and_names_every_option(tmp_path: Path) -> None:
    """docs/coordinator.toml (linked from the README, --help and ROLE_NOT_PERMITTED) is a
    valid configuration as shipped and with every commented option switched on."""
    text = SAMPLE.read_text()
    config = load_config(tmp_path, config_file=SAMPLE)
    assert all((config.validators, config.trainers, config.operators))
    for option in OPTIONS:
        assert f"# {option.name} = " in text, f"{option.name} is missing from {SAMPLE.name}"
    everything = tmp_path / "everything.toml"
    switched_on = re.sub(r"^# (\w+ = .*?)(  # \(default: none\))?$", r"\1", text, flags=re.M)
    everything.write_text(switched_on.replace("# [pools.", "[pools.").replace("# invite", "invite"))
    loaded = load_config(tmp_path, config_file=everything)
    assert loaded.dashboard_listen == "127.0.0.1:7080"
    assert loaded.pools["partners"].invite_only
