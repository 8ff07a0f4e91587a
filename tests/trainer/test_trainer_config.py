"""The trainer's TOML configuration and its command line's refusals (one line, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollnet.reference.cli import main
from rollnet.reference.trainer.config import (
    TrainerConfig,
    TrainerConfigError,
    load_trainer_config,
)
from rollnet.reference.trainer.loss import LossConfig


def test_a_full_configuration_is_read(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(
        """
environment = "reverse"
environment_config = { min_length = 2, max_length = 4 }
group_size = 4
batch_groups = 3
max_off_policy_steps = 2
learning_rate = 1e-3
grad_clip = 0.05
normalize_advantage_std = true

[loss]
kind = "tis"
tis_cap = 3
kl_coef = 0.01
"""
    )
    config = load_trainer_config(path)
    assert config.environment_config == {"min_length": 2, "max_length": 4}
    assert config.group_size == 4
    assert config.batch_groups == 3
    assert config.max_off_policy_steps == 2
    assert config.keep_checkpoints == 3
    assert config.grad_clip == 0.05
    assert config.normalize_advantage_std is True
    assert config.loss == LossConfig(kind="tis", tis_cap=3.0, kl_coef=0.01)


def test_defaults() -> None:
    config = TrainerConfig()
    assert config.max_off_policy_steps == 0
    assert config.learning_rate == 1e-6
    assert config.loss.kind == "clip"
    assert config.loss.clip_epsilon == 0.2
    assert config.loss.clip_delta == 4.0
    assert config.keep_checkpoints == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("group_sizes = 4", "unknown key 'group_sizes'"),
        ("group_size = 1", "group_size = 1 is out of range"),
        ('group_size = "4"', "group_size: expected int"),
        ("learning_rate = nan", "learning_rate = nan is out of range"),
        ("[loss]\nkind = 'ppo'", "loss kind 'ppo'"),
        ("[loss]\nepsilon = 0.2", "unknown key loss.epsilon"),
        ("loss = 3", "loss must be a table"),
        ("max_off_policy_steps = -1", "max_off_policy_steps = -1"),
        ("group_size = ", "not TOML"),
    ],
)
def test_bad_configuration_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(text + "\n")
    with pytest.raises(TrainerConfigError, match=message.replace("(", r"\(")):
        load_trainer_config(path)


def test_the_command_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "trainer.toml"
    bad.write_text("batch_groups = 0\n")
    common = ["--coordinator", "127.0.0.1:1", "--key", str(tmp_path / "k.key")]
    data = ["--data-dir", str(tmp_path / "data")]
    code = main(["trainer", *common, "--model", str(tmp_path), *data, "--config", str(bad)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "batch_groups = 0 is out of range" in err
    assert len(err.splitlines()) == 1
    code = main(["trainer", *common, "--model", str(tmp_path / "none"), *data])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "--model" in err
    assert "is not a directory" in err
    bad.write_text('environment = "chess"\n')
    code = main(["trainer", *common, "--model", str(tmp_path), *data, "--config", str(bad)])
    assert code == 2
    assert "unknown environment 'chess'" in capsys.readouterr().err
    bad.write_text("[environment_config]\nmax_length = 99\n")
    code = main(["trainer", *common, "--model", str(tmp_path), *data, "--config", str(bad)])
    assert code == 2
    assert "max_length" in capsys.readouterr().err
    assert not (tmp_path / "k.key").exists(), "nothing is created before the input is checked"
