"""Every mistake a new user makes on the command line ends in one line naming what is wrong and
what to do, exit code 2 — no traceback, nothing created, nothing left running (issue 21). Each
case goes through the real entry point, ``rollnet.reference.cli.main``."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollnet.reference.cli import main
from rollnet.sdk import Identity


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit code and stderr of ``rollnet ARGV`` (stderr must be one line)."""
    capsys.readouterr()
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("{")]  # JSON log records
    assert "Traceback" not in err
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    return code, lines[0]


def fails(capsys: pytest.CaptureFixture[str], *argv: str, says: str) -> str:
    code, line = run(capsys, *argv)
    assert code == 2, line
    assert says in line, line
    return line


@pytest.fixture(autouse=True)
def _quiet_logging() -> Iterator[None]:
    yield
    logging.getLogger().handlers.clear()  # configure_logging in a command installs a handler


# --------------------------------------------------------------------------- key files
@pytest.mark.parametrize(
    "argv",
    [
        ["keys", "show", "{dir}"],
        ["nodes", "list", "--coordinator", "127.0.0.1:1", "--key", "{dir}"],
        [
            *["checkpoint", "publish", "--coordinator", "127.0.0.1:1", "--key", "{dir}"],
            *["--model", "{model}", "--step", "0"],
        ],
    ],
    ids=["keys-show", "nodes-list", "checkpoint-publish"],
)
def test_a_directory_given_as_a_key_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")  # the publisher refuses a model without one
    (model / "model.safetensors").write_bytes(b"x")
    filled = [a.format(dir=tmp_path, model=model) for a in argv]
    fails(capsys, *filled, says=f"key file {tmp_path} is a directory")


def test_a_malformed_or_missing_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "bad.key"
    garbage.write_text("not a key")
    garbage.chmod(0o600)
    fails(capsys, "keys", "show", str(garbage), says="is not an unencrypted PKCS#8 PEM key")
    fails(capsys, "keys", "show", str(tmp_path / "nope.key"), says="rollnet keys generate")
    coordinator = ["coordinator", "--data-dir", str(tmp_path / "data")]
    fails(capsys, *coordinator, "--key-file", str(garbage), says="key_file: key file")
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- databases
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqllite:///x.db", "unsupported database sqllite://"),
        ("mysql://root@localhost/rollnet", "unsupported database mysql://"),
        ("not-a-url", "'not-a-url' is not a database URL"),
    ],
)
def test_database_urls_rollnet_cannot_use(
    url: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["ledger", "verify", "--db", url],
        ["ledger", "balances", "--db", url],
        ["ledger", "export", "--db", url, "--out", str(tmp_path / "out.jsonl")],
    ):
        line = fails(capsys, *argv, says=says)
        assert "sqlite:///PATH or postgresql://" in line  # the forms that work
    fails(capsys, "coordinator", "--data-dir", str(tmp_path / "data"), "--db", url, says=says)
    assert list(tmp_path.iterdir()) == []


def test_ledger_commands_do_not_create_a_missing_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "deep" / "missing.db"
    for argv in (
        ["ledger", "verify", "--db", f"sqlite:///{missing}"],
        ["ledger", "balances", "--db", f"sqlite:///{missing}"],
        ["ledger", "export", "--db", f"sqlite:///{missing}", "--out", str(tmp_path / "o.jsonl")],
    ):
        fails(capsys, *argv, says=f"no ledger at {missing}: the file does not exist")
    assert list(tmp_path.iterdir()) == []  # neither the file nor its directory


def test_an_unreachable_postgresql(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://postgres@127.0.0.1:{port}/rollnet"
    data = tmp_path / "data"
    line = fails(capsys, "coordinator", "--data-dir", str(data), "--db", url, says="database:")
    assert "is the database server running" in line
    fails(capsys, "ledger", "balances", "--db", url, says="cannot read the ledger")


@pytest.mark.postgres
def test_a_missing_postgresql_database(
    postgres_server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server_url.rsplit("/", 1)[0] + "/rollnet_no_such_database"
    data = tmp_path / "data"
    line = fails(capsys, "coordinator", "--data-dir", str(data), "--db", url, says="database:")
    assert '"rollnet_no_such_database" does not exist' in line
    assert "create it first" in line


# --------------------------------------------------------------------------- paths
def test_a_data_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    fails(capsys, "coordinator", "--data-dir", str(a_file), says="is a file, not a directory")
    fails(capsys, "model", "init-tiny", "--out", str(a_file), says="it is a file")
    fails(
        capsys,
        "model",
        "init-tiny",
        "--out",
        str(a_file / "sub"),
        says=f"{a_file} is a file",
    )


def test_export_into_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "ledger.jsonl"
    fails(
        capsys,
        "ledger",
        "export",
        "--db",
        "sqlite:///x.db",
        "--out",
        str(out),
        says="does not exist (create it first)",
    )


def test_unreadable_tls_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    garbage = tmp_path / "cert.pem"
    garbage.write_text("not a certificate")
    coordinator = ["coordinator", "--data-dir", str(data)]
    fails(
        capsys,
        *coordinator,
        "--tls-cert",
        str(tmp_path / "missing.pem"),
        "--tls-key",
        str(garbage),
        says="cannot read it: No such file or directory",
    )
    fails(
        capsys,
        *coordinator,
        "--tls-cert",
        str(garbage),
        "--tls-key",
        str(garbage),
        says="not a PEM certificate chain",
    )
    fails(capsys, *coordinator, "--tls-cert", str(garbage), says="given together")
    worker = ["worker", "--coordinator", "127.0.0.1:1", "--key", "k", "--data-dir", "d"]
    fails(capsys, *worker, "--tls-ca", str(tmp_path / "none.pem"), says="no such file")
    assert not data.exists()


# --------------------------------------------------------------------------- values
@pytest.mark.parametrize(
    "argv",
    [
        ["coordinator", "--data-dir", "{tmp}/data", "--network-id", "bad id"],
        [
            *["worker", "--coordinator", "127.0.0.1:1", "--key", "k", "--data-dir", "d"],
            *["--network-id", "bad id"],
        ],
        ["nodes", "list", "--coordinator", "127.0.0.1:1", "--key", "k", "--network-id", "bad id"],
    ],
    ids=["coordinator", "worker", "nodes"],
)
def test_a_malformed_network_id(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [a.format(tmp=tmp_path) for a in argv]
    fails(capsys, *filled, says="'bad id' is not a network id")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["coordinator", "--data-dir", "{tmp}/data", "--compute-dtype", "fp16"],
            "--compute-dtype: compute_dtype = 'fp16': 'fp16' is not a compute dtype",
        ),
        (
            [
                *["worker", "--coordinator", "127.0.0.1:1", "--key", "{tmp}/k"],
                *["--data-dir", "{tmp}/data", "--dtype", "fp16"],
            ],
            "argument --dtype: 'fp16' is not a compute dtype: one of float32, bfloat16",
        ),
        (
            [
                *["validator", "--coordinator", "127.0.0.1:1", "--key", "{tmp}/k"],
                *["--data-dir", "{tmp}/data", "--dtype", "float32", "--dtype", "half"],
            ],
            "argument --dtype: 'half' is not a compute dtype: one of float32, bfloat16",
        ),
    ],
    ids=["coordinator", "worker", "validator"],
)
def test_an_unknown_compute_dtype(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fails(capsys, *[a.format(tmp=tmp_path) for a in argv], says=says)
    assert list(tmp_path.iterdir()) == []  # no key, no data directory


@pytest.mark.parametrize("command", ["coordinator", "worker", "validator"])
def test_an_unknown_log_level(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = ["--coordinator", "127.0.0.1:1", "--key", "k"] if command != "coordinator" else []
    argv = [command, *node, "--data-dir", str(tmp_path / "data"), "--log-level", "LOUD"]
    fails(capsys, *argv, says="'LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL")


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("localhost", "'localhost' is not HOST:PORT: no port"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
        (":7070", "no host"),
        ("::1:7070", "an IPv6 address goes in brackets"),
    ],
)
def test_listen_addresses_without_a_valid_port(
    listen: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    fails(capsys, "coordinator", "--data-dir", str(data), "--listen", listen, says=says)
    if listen != ":7070":  # a bare port is loopback for these two
        for flag in ("--metrics-listen", "--dashboard-listen"):
            fails(capsys, "coordinator", "--data-dir", str(data), flag, listen, says=says)
    fails(
        capsys,
        "nodes",
        "list",
        "--coordinator",
        listen,
        "--key",
        "k",
        says=says,
    )
    assert not data.exists()


def test_two_listeners_on_one_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    argv = ["coordinator", "--data-dir", str(data), "--listen", "127.0.0.1:7070"]
    fails(capsys, *argv, "--metrics-listen", "7070", says="port 7070 is listen's too")
    assert not data.exists()


@pytest.mark.parametrize("flag", ["--listen", "--metrics-listen", "--dashboard-listen"])
def test_a_coordinator_port_in_use(
    flag: str, taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    argv = ["coordinator", "--data-dir", str(data), "--listen", "127.0.0.1:0"]
    line = fails(capsys, *argv, flag, f"127.0.0.1:{taken_port}", says="the port is in use")
    assert flag in line  # the option to change
    assert not data.exists()  # nothing created


def test_a_validator_metrics_port_in_use(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "validator.key"
    argv = ["validator", "--coordinator", "127.0.0.1:1", "--key", str(key)]
    argv += ["--data-dir", str(tmp_path / "data"), "--metrics-listen", f"127.0.0.1:{taken_port}"]
    fails(capsys, *argv, says=f"--metrics-listen 127.0.0.1:{taken_port}: cannot listen there")
    assert not key.exists()  # refused before the key was created


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('validators = ["abc"]', "validators = ['abc']: not a node id (32 hex characters)"),
        ('operators = ["zz" ]', "operators = ['zz']: not a node id"),
        ('environments = ["arithmetic", "nope"]', "environments: 'nope' not installed here"),
        ("network_id = 'has space'", "is not a network id"),
        ("listen = 'localhost'", "'localhost' is not HOST:PORT"),
        (
            "compute_dtype = 'float16'",
            "compute_dtype = 'float16': 'float16' is not a compute dtype: one of float32, bfloat16",
        ),
    ],
)
def test_configuration_values(
    toml: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text(toml + "\n")
    data = tmp_path / "data"
    fails(capsys, "coordinator", "--data-dir", str(data), "--config", str(config), says=says)
    assert not data.exists()


def test_a_worker_refuses_a_device_or_backend_this_machine_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    import torch

    key = tmp_path / "worker.key"
    worker = ["worker", "--coordinator", "127.0.0.1:1", "--key", str(key)]
    worker += ["--data-dir", str(tmp_path / "data")]
    if not torch.cuda.is_available():
        fails(capsys, *worker, "--device", "cuda", says="--device cuda: CUDA is not available")
        fails(capsys, "validator", *worker[1:], "--device", "cuda:0", says="CUDA is not available")
    if importlib.util.find_spec("vllm") is None:
        fails(capsys, *worker, "--backend", "vllm", says="vLLM is not installed here")
    fails(capsys, *worker, "--device", "toaster", says="is not a device")
    assert not key.exists()  # refused before the key was made (and long before registering)


def test_an_unexpected_error_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A bug somewhere under a command: one line naming it, and how to see the traceback.
    from rollnet.reference.cli import keys

    def broken(_identity: Identity) -> str:
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(keys, "_describe", broken)
    code, line = run(capsys, "keys", "generate", "--out", str(tmp_path / "node.key"))
    assert code == 2
    assert line.startswith("rollnet keys generate: unexpected error RuntimeError")
    assert "ROLLNET_TRACEBACK=1" in line
