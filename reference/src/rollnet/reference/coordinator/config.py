"""Coordinator configuration: one table of options, read from TOML, then env, then flags.

Every option is declared once in :data:`OPTIONS` with its TOML key, its command-line flag, its
environment variable and its help text, so ``rollnet coordinator --help`` documents every option
and precedence is the same for all of them: flag > environment > TOML file > default.
Allow-lists, pools and invite tokens are structured and live in the TOML file only; the sample
``docs/coordinator.toml`` shows every key.

Every value is checked when the configuration is loaded, before anything is created or started:
addresses are ``HOST:PORT`` with a port in range, allow-lists hold node ids or public keys,
environments are installed ones, the compute dtype is one the protocol names, and the data
directory is not a file.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from rollnet.reference.addresses import split_host_port
from rollnet.sdk.dtypes import COMPUTE_DTYPES, FLOAT32
from rollnet.sdk.node import DEFAULT_NETWORK_ID

ENV_PREFIX = "ROLLNET_COORDINATOR_"
#: Where the sample configuration lives (in the source tree), for messages and ``--help``.
SAMPLE_CONFIG = "docs/coordinator.toml"
#: Network ids: what signed calls name as their audience, printed in logs and file names.
NETWORK_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HEX = re.compile(r"[0-9a-f]+")
#: Rollouts of a batch a validator checks in full under a post-commitment challenge: the
#: figures behind the choice are in docs/verification.md, "Post-commitment challenges".
DEFAULT_CHALLENGED_ROLLOUTS = 8


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A pool nodes may join. Invite-only pools need one of their tokens at registration."""

    invite_tokens: frozenset[str] = frozenset()

    @property
    def invite_only(self) -> bool:
        """Whether registration needs an invite token."""
        return bool(self.invite_tokens)


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Everything the coordinator reads at start-up. Durations are timedeltas."""

    data_dir: Path
    database_url: str | None = None
    listen: str = "127.0.0.1:7070"
    metrics_listen: str = ""
    #: The operator dashboard (read-only web page) HOST:PORT; "" serves none. A host that is
    #: not a loopback address needs operators to log in (see coordinator.dashboard).
    dashboard_listen: str = ""
    network_id: str = DEFAULT_NETWORK_ID
    #: The dtype the network computes in: what workers generate and validators prefill in.
    compute_dtype: str = FLOAT32
    key_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    heartbeat_interval: timedelta = timedelta(seconds=10)
    heartbeat_interval_min: timedelta = timedelta(seconds=1)
    heartbeat_interval_max: timedelta = timedelta(seconds=120)
    suspect_after_missed: float = 2.0
    offline_after_missed: float = 4.0
    lease_duration: timedelta = timedelta(seconds=120)
    max_attempts: int = 3
    #: Leases of one validation job before it is given up (FAILED; the task queued again).
    max_validation_attempts: int = 5
    max_leases_per_node: int = 4
    pull_wait_max: timedelta = timedelta(seconds=20)
    retry_after: timedelta = timedelta(seconds=2)
    sweep_interval: timedelta = timedelta(seconds=1)
    async_level: int = 2
    eject_after_rejects: int = 3
    trusted_streak: int = 10
    min_validation_rate: float = 0.1
    #: Rollouts of a batch a validator checks in full (prefill, TOPLOC, sampling), drawn by the
    #: job's post-commitment challenge; 0 checks every rollout. docs/verification.md,
    #: "Post-commitment challenges", has the detection rates it gives.
    challenged_rollouts: int = DEFAULT_CHALLENGED_ROLLOUTS
    signature_skew: timedelta = timedelta(seconds=60)
    max_message_bytes: int = 16 * 1024 * 1024
    #: Calls gRPC may hold before the server code takes them; beyond it gRPC starts refusing new
    #: calls (CANCELLED), refusing all at twice this. gRPC's own default (1,000) refuses
    #: heartbeats of a 10,000-node swarm in ordinary bursts.
    max_pending_calls: int = 20_000
    #: PostgreSQL only (SQLite has one writer thread): threads running write transactions;
    #: 0 picks CPU cores + 1, at most 8. More threads than that contend for the GIL: on 2 cores,
    #: 8 threads leased 100 cycles/s where 3 leased 155.
    database_write_threads: int = 0
    max_blob_bytes: int = 512 * 1024 * 1024
    #: Recent small blobs (rollout batches) kept in memory as well, in bytes: a batch is read
    #: back by the challenge and validation right after its upload. The coordinator's memory
    #: rises by up to this much after start-up, then levels off (docs/reliability.md, "Soak").
    blob_cache_bytes: int = 64 * 1024 * 1024
    #: A worker's uploads that no commitment references yet, in bytes (see coordinator.uploads).
    upload_quota_bytes: int = 1024 * 1024 * 1024
    #: Uploads are refused (STORAGE_FULL) when they would leave less free space than this.
    min_free_disk_bytes: int = 1024 * 1024 * 1024
    #: An upload that nothing references this long after it arrived is deleted.
    orphan_blob_ttl: timedelta = timedelta(hours=6)
    #: The rollout batch of a commitment that earned no credit (its validation rejected it, or
    #: failed for good) is deleted this long after; 0 keeps every batch forever.
    rejected_blob_ttl: timedelta = timedelta(days=7)
    blob_sweep_interval: timedelta = timedelta(seconds=60)
    rate_limit_per_key: float = 200.0
    rate_burst_per_key: int = 400
    registrations_per_ip_per_minute: int = 60
    #: Unregistered keys whose RegisterNode calls the replay cache holds at once (one signature
    #: window, twice signature_skew); a new key beyond them is refused RATE_LIMITED. Fresh keys
    #: have this pool to themselves: a flood of them never refuses or unprotects registered ones.
    #: One address holds at most the registrations it is admitted within that window
    #: (registrations_per_ip_per_minute x 2 x signature_skew / 60 s: 120 by default).
    max_registering_keys: int = 10_000
    head_sign_interval: timedelta = timedelta(seconds=60)
    seed: int = 0
    max_new_tokens: int = 32768
    max_samples_per_prompt: int = 256
    max_temperature: float = 2.0
    environments: frozenset[str] = frozenset()
    validators: frozenset[str] = frozenset()
    trainers: frozenset[str] = frozenset()
    operators: frozenset[str] = frozenset()
    pools: Mapping[str, PoolConfig] = field(default_factory=lambda: {"": PoolConfig()})

    @property
    def blob_dir(self) -> Path:
        """Where content-addressed blobs are stored."""
        return self.data_dir / "blobs"

    @property
    def resolved_key_file(self) -> Path:
        """The coordinator's Ed25519 key file (created on first start)."""
        return self.key_file or self.data_dir / "coordinator.key"


def _seconds(value: str | int | float) -> timedelta:
    seconds = float(value)
    if seconds < 0:
        raise ValueError("must not be negative")
    return timedelta(seconds=seconds)


def _positive_int(value: str | int) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError("must be positive")
    return number


def _non_negative_int(value: str | int) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must not be negative")
    return number


def _fraction(value: str | int | float) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("must be between 0 and 1")
    return number


def _positive_float(value: str | int | float) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be positive")
    return number


def _path(value: str) -> Path:
    return Path(value).expanduser()


def check_network_id(value: str) -> str:
    """``value`` if it is a valid network id, else :class:`ValueError` saying what one is."""
    if not isinstance(value, str) or not NETWORK_ID_PATTERN.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a network id: 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (e.g. rollnet-local)"
        )
    return value


def check_compute_dtype(value: str) -> str:
    """``value`` if it is a compute dtype a network may prescribe, else :class:`ValueError`."""
    if not isinstance(value, str) or value not in COMPUTE_DTYPES:
        raise ValueError(f"{value!r} is not a compute dtype: one of {', '.join(COMPUTE_DTYPES)}")
    return value


def _listen(value: str) -> str:
    split_host_port(str(value), allow_port_zero=True)
    return str(value)


def _optional_listen(value: str) -> str:
    """A listen address, or "" for none; a bare port means loopback (``7080``, ``:7080``)."""
    text = str(value)
    if text == "":
        return ""
    if text.isascii() and text.lstrip(":").isdigit() and text.count(":") <= 1:
        text = f"127.0.0.1:{text.lstrip(':')}"
    split_host_port(text, allow_port_zero=True)
    return text


def _database(value: str) -> str:
    # Imported here: the ledger's engine module pulls in SQLAlchemy.
    from rollnet.ledger.engine import database_url

    database_url(str(value))  # raises DatabaseUrlError (a ValueError) naming the good forms
    return str(value)


@dataclass(frozen=True, slots=True)
class Option:
    """One scalar option: where it is read from and how it is parsed."""

    name: str
    parse: Callable[[Any], Any]
    help: str

    @property
    def flag(self) -> str:
        """The command-line flag."""
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """The environment variable."""
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "database_url",
        _database,
        "database URL: sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
        "(default: SQLite file DATA_DIR/rollnet.db)",
    ),
    Option("listen", _listen, "gRPC listen address HOST:PORT (port 0 picks a free port)"),
    Option("metrics_listen", _optional_listen, "Prometheus metrics HOST:PORT ('' disables)"),
    Option(
        "dashboard_listen",
        _optional_listen,
        "operator dashboard (web page) HOST:PORT, a bare PORT meaning 127.0.0.1:PORT; "
        "'' disables (default). A non-loopback host requires an operator login",
    ),
    Option("network_id", check_network_id, "network id: the audience every signed call must name"),
    Option(
        "compute_dtype",
        check_compute_dtype,
        "dtype the network computes in: workers generate and validators prefill in it "
        "(float32 or bfloat16)",
    ),
    Option("key_file", _path, "coordinator Ed25519 key (default: DATA_DIR/coordinator.key)"),
    Option("tls_cert", _path, "PEM certificate chain: serve TLS (needs --tls-key)"),
    Option("tls_key", _path, "PEM private key of --tls-cert"),
    Option("heartbeat_interval", _seconds, "default heartbeat interval, seconds"),
    Option("heartbeat_interval_min", _seconds, "smallest interval a node may ask for, seconds"),
    Option("heartbeat_interval_max", _seconds, "largest interval a node may ask for, seconds"),
    Option("suspect_after_missed", _positive_float, "intervals without heartbeat -> SUSPECT"),
    Option("offline_after_missed", _positive_float, "intervals without heartbeat -> OFFLINE"),
    Option("lease_duration", _seconds, "task and validation-job lease duration, seconds"),
    Option("max_attempts", _positive_int, "leases per task before it is FAILED"),
    Option(
        "max_validation_attempts",
        _positive_int,
        "leases per validation job before it is given up (its task queued again)",
    ),
    Option("max_leases_per_node", _positive_int, "concurrent leases a node may hold"),
    Option("pull_wait_max", _seconds, "longest PullTask long-poll, seconds"),
    Option("retry_after", _seconds, "retry hint when there is no work, seconds"),
    Option("sweep_interval", _seconds, "how often expired leases and liveness are swept, seconds"),
    Option("async_level", _non_negative_int, "bounded staleness: steps a checkpoint may lag"),
    Option("eject_after_rejects", _positive_int, "rejected commitments that eject a node"),
    Option("trusted_streak", _positive_int, "accepted streak after which spot checks thin out"),
    Option("min_validation_rate", _fraction, "least share of a trusted node's work validated"),
    Option(
        "challenged_rollouts",
        _non_negative_int,
        "rollouts per batch a validator checks in full, drawn after the commitment (0: all)",
    ),
    Option("signature_skew", _seconds, "accepted clock skew of signed calls, seconds"),
    Option("max_message_bytes", _positive_int, "largest gRPC message, bytes"),
    Option(
        "max_pending_calls",
        _positive_int,
        "calls gRPC may queue before the server takes them (refused beyond 2x)",
    ),
    Option(
        "database_write_threads",
        _non_negative_int,
        "PostgreSQL write threads (0: CPU cores + 1, at most 8)",
    ),
    Option("max_blob_bytes", _positive_int, "largest blob upload, bytes"),
    Option(
        "blob_cache_bytes",
        _non_negative_int,
        "recent rollout batches also kept in memory, bytes (0: none)",
    ),
    Option(
        "upload_quota_bytes",
        _positive_int,
        "a worker's uploads not yet referenced by a commitment, bytes (whole disk blocks)",
    ),
    Option(
        "min_free_disk_bytes",
        _non_negative_int,
        "free space uploads must leave on the blob store's file system, bytes",
    ),
    Option("orphan_blob_ttl", _seconds, "age at which an unreferenced upload is deleted, seconds"),
    Option(
        "rejected_blob_ttl",
        _seconds,
        "how long the batch of rejected (or unvalidatable) work is kept, seconds; 0: forever",
    ),
    Option("blob_sweep_interval", _seconds, "how often orphan uploads are swept, seconds"),
    Option("rate_limit_per_key", _positive_float, "sustained calls per second per key"),
    Option("rate_burst_per_key", _positive_int, "burst of calls per key"),
    Option("registrations_per_ip_per_minute", _positive_int, "RegisterNode calls per IP/minute"),
    Option(
        "max_registering_keys",
        _positive_int,
        "unregistered keys calling RegisterNode within one signature window (2 x skew); "
        "more are refused RATE_LIMITED",
    ),
    Option("head_sign_interval", _seconds, "how often the ledger chain head is signed, seconds"),
    Option("seed", _non_negative_int, "coordinator seed for prompt draws and sampling seeds"),
    Option("max_new_tokens", _positive_int, "largest max_new_tokens a trainer may ask for"),
    Option("max_samples_per_prompt", _positive_int, "largest group size a trainer may ask for"),
    Option(
        "max_temperature", _positive_float, "highest sampling temperature a trainer may ask for"
    ),
)
_OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}
_STRUCTURED_KEYS = frozenset(
    {"validators", "trainers", "operators", "pools", "environments", "data_dir"}
)


class ConfigError(ValueError):
    """The configuration is invalid; the message names the offending key and source."""


#: ``rollnet coordinator --help``'s closing words: the keys only the TOML file can set.
TOML_ONLY_HELP = f"""\
keys only the TOML file (--config) sets:
  validators = ["NODE_ID_OR_PUBLIC_KEY", ...]  keys that may register as validators
  trainers   = [...]                           keys that may register as trainers
  operators  = [...]                           keys that may use 'rollnet nodes' and log in
                                               to the dashboard
  environments = ["arithmetic", ...]           environments trainers may ask for (default any
                                               installed one)
  [pools.NAME] invite_tokens = ["..."]         invite-only pools
A key's node id and public key: 'rollnet keys show KEY_FILE'. Sample file with every key:
{SAMPLE_CONFIG} in the rollnet source tree. Precedence: defaults < TOML file <
{ENV_PREFIX}* environment variables < flags."""


def _default_text(name: str) -> str:
    value = {f.name: f.default for f in fields(CoordinatorConfig)}.get(name)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}"
    if value is None or value == "":
        return ""
    return str(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--data-dir``, ``--config`` and one flag per option to ``parser``."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="state directory: SQLite ledger, blobs, coordinator key (created if missing)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"TOML file; environment and flags override it (sample: {SAMPLE_CONFIG})",
    )
    for option in OPTIONS:
        default = _default_text(option.name)
        shown = f"; default {default}" if default else ""
        flags = ["--db"] if option.name == "database_url" else [option.flag]
        parser.add_argument(
            *flags,
            dest=option.name,
            default=None,
            metavar=option.name.upper(),
            help=f"{option.help}{shown} [{option.env}]",
        )


def _parse(option: Option, raw: Any, source: str) -> Any:
    try:
        return option.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {option.name} = {raw!r}: {exc}") from exc


def _node_set(raw: Any, key: str, source: str) -> frozenset[str]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise ConfigError(f"{source}: {key} must be a list of node ids or public keys (hex)")
    ids = frozenset(item.lower() for item in raw)
    for item in sorted(ids):
        if len(item) not in (32, 64) or not _HEX.fullmatch(item):
            raise ConfigError(
                f"{source}: {key} = [{item!r}]: not a node id (32 hex characters) or a public "
                "key (64 hex characters); 'rollnet keys show KEY_FILE' prints both"
            )
    return ids


def _environments(raw: Any, source: str) -> frozenset[str]:
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise ConfigError(f"{source}: environments must be a list of names")
    from rollnet.reference.envs.registry import available_environments

    installed = available_environments()
    unknown = sorted(set(raw) - set(installed))
    if unknown:
        raise ConfigError(
            f"{source}: environments: {', '.join(map(repr, unknown))} not installed here "
            f"(installed: {', '.join(installed)})"
        )
    return frozenset(raw)


def _pools(raw: Any, source: str) -> dict[str, PoolConfig]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [pools] must be a table of pool tables")
    pools: dict[str, PoolConfig] = {"": PoolConfig()}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: pools.{name} must be a table")
        unknown = set(table) - {"invite_tokens"}
        if unknown:
            raise ConfigError(f"{source}: pools.{name}: unknown key(s) {sorted(unknown)}")
        tokens = table.get("invite_tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            raise ConfigError(f"{source}: pools.{name}.invite_tokens must be non-empty strings")
        key = "" if name == "default" else name
        pools[key] = PoolConfig(invite_tokens=frozenset(tokens))
    return pools


def load_config(
    data_dir: Path,
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> CoordinatorConfig:
    """Build the configuration from a TOML file, then ``environ``, then ``flags``.

    ``environ`` is read only when passed (the CLI passes ``os.environ``); the library never reads
    the environment behind the caller's back.
    """
    values: dict[str, Any] = {}
    if config_file is not None:
        source = str(config_file)
        try:
            document = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{config_file}: not UTF-8 text (TOML is UTF-8): {exc}") from None
        except RecursionError:  # tomllib recurses once per level of nesting
            raise ConfigError(f"{config_file}: invalid TOML: nested too deeply") from None
        except ValueError as exc:  # TOMLDecodeError, or int()'s 4300-digit limit
            raise ConfigError(f"{config_file}: invalid TOML: {exc}") from None
        for key, raw in document.items():
            if key in ("validators", "trainers", "operators"):
                values[key] = _node_set(raw, key, source)
            elif key == "environments":
                values[key] = _environments(raw, source)
            elif key == "pools":
                values["pools"] = _pools(raw, source)
            elif key in _OPTIONS_BY_NAME:
                values[key] = _parse(_OPTIONS_BY_NAME[key], raw, source)
            else:
                known = sorted(set(_OPTIONS_BY_NAME) | _STRUCTURED_KEYS - {"data_dir"})
                raise ConfigError(f"{source}: unknown key {key!r}; known keys: {known}")
    for option in OPTIONS:
        if environ is not None and option.env in environ:
            values[option.name] = _parse(option, environ[option.env], option.env)
        if flags is not None and flags.get(option.name) is not None:
            values[option.name] = _parse(option, flags[option.name], option.flag)
    _check_data_dir(data_dir)
    config = CoordinatorConfig(data_dir=data_dir, **values)
    _validate(config)
    return config


def _check_data_dir(data_dir: Path) -> None:
    """A data directory may be missing (it is created on start), but never a file."""
    for part in (data_dir, *data_dir.parents):
        if part.exists():
            if not part.is_dir():
                where = "it" if part == data_dir else str(part)
                raise ConfigError(
                    f"--data-dir {data_dir}: {where} is a file, not a directory "
                    "(choose another path)"
                )
            return


def _validate(config: CoordinatorConfig) -> None:
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls_cert and tls_key must be given together")
    if (
        not config.heartbeat_interval_min
        <= config.heartbeat_interval
        <= (config.heartbeat_interval_max)
    ):
        raise ConfigError("heartbeat_interval must lie between its min and max")
    if config.offline_after_missed <= config.suspect_after_missed:
        raise ConfigError("offline_after_missed must exceed suspect_after_missed")
    if config.lease_duration <= config.heartbeat_interval:
        raise ConfigError("lease_duration must exceed heartbeat_interval (heartbeats extend it)")
    if config.orphan_blob_ttl <= config.lease_duration:
        # An honest worker commits within its lease; a shorter TTL could delete its batch first.
        raise ConfigError("orphan_blob_ttl must exceed lease_duration")
    if config.blob_sweep_interval <= timedelta(0):
        raise ConfigError("blob_sweep_interval must be positive")
    for name, check in (("network_id", check_network_id), ("compute_dtype", check_compute_dtype)):
        try:
            check(getattr(config, name))
        except ValueError as error:
            raise ConfigError(f"{name}: {error}") from None


def with_overrides(config: CoordinatorConfig, **changes: Any) -> CoordinatorConfig:
    """A copy of ``config`` with ``changes`` applied and validated (handy in tests)."""
    names = {f.name for f in fields(CoordinatorConfig)}
    unknown = set(changes) - names
    if unknown:
        raise ConfigError(f"unknown option(s): {sorted(unknown)}")
    updated = replace(config, **changes)
    _validate(updated)
    return updated


def environment() -> Mapping[str, str]:
    """The process environment, for the CLI to pass explicitly to :func:`load_config`."""
    return os.environ


def write_threads(config: CoordinatorConfig) -> int:
    """How many threads run PostgreSQL write transactions (see ``database_write_threads``)."""
    if config.database_write_threads:
        return config.database_write_threads
    return min(8, (os.cpu_count() or 1) + 1)
