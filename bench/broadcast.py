"""Checkpoint broadcast: rollnet's relay tree against shardcast 0.3.2, side by side in one run.

Same machine, same bytes, same topology: 1 origin, 2 relays, 8 clients (each in its own
process), a checkpoint of ``--mib`` MiB of incompressible weights. For each system it prints
the time from publishing until every client holds a verified copy, when the first byte reached
a leaf, and the aggregate throughput (10 copies land: 2 relays + 8 clients) against the
machine's limit measured in the same run: ten plain local copies of the same file.

Then deltas, on consecutive steps of the reference trainer made here
(:func:`~rollnet.reference.trainer.synthetic_steps.write_trainer_steps`: its ``Learner`` — fp32
master weights, AdamW, gradient clipping, the GRPO loss — and its ``export_checkpoint``, at
``TrainerConfig``'s defaults, on seeded synthetic rollout groups) of a Qwen2-architecture model
(``--delta-hidden``, ``--delta-layers``). It prints the share of bf16 weights left
bit-identical (the sparsity), delta bytes against the full checkpoint, and the end-to-end time
of a delta step through the same tree beside the same step fetched whole.

    python bench/broadcast.py [--mib 512] [--clients 8] [--no-shardcast] [--lr LR]

shardcast (``pip install shardcast==0.3.2``, in requirements/dev.txt) runs with its defaults
except where that is kinder to it: its middle nodes poll upstream every second instead of every
30, its clients retry a missing shard after 1 s instead of 2-15 s, and they start once every
middle node lists the version (see ``shardcast_client``). Each server holds the ``data1.bin``
its downloaders time at start-up, and each client keeps the distribution listing it downloads
in a file of its own (shardcast's one shared file crashes clients that race on it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

_MIB = 1024 * 1024
_SHARDCAST_SHARD = 50_000_000  # shardcast 0.3.2's SHARDCAST_SHARD_SIZE default
_PYTHON = sys.executable
_RELAY = [_PYTHON, "-m", "rollnet.reference.cli", "relay"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def write_model(directory: Path, size: int) -> Path:
    """A checkpoint directory whose weights are ``size`` random bytes (one U8 tensor)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text('{"model_type": "qwen2"}')
    (directory / "tokenizer.json").write_text('{"version": "1.0"}')
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}})
    raw = header.encode()
    with open(directory / "model.safetensors", "wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        left = size
        while left:
            chunk = os.urandom(min(left, 16 * _MIB))
            out.write(chunk)
            left -= len(chunk)
    return directory


def settle() -> None:
    """Write back what earlier phases left dirty, so no phase pays for another's writes."""
    os.sync()


def plain_copies(source: Path, scratch: Path, copies: int) -> float:
    """Seconds for ``copies`` plain local copies of ``source`` (no fsync: neither system under
    test syncs either)."""
    scratch.mkdir(parents=True, exist_ok=True)
    settle()
    started = time.monotonic()
    for index in range(copies):
        shutil.copyfile(source, scratch / f"copy{index}")
    elapsed = time.monotonic() - started
    shutil.rmtree(scratch)
    return elapsed


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(processes: list[subprocess.Popen[str]]) -> float:
    """User + system CPU seconds the live ``processes`` have used so far (``/proc/PID/stat``)."""
    total = 0
    for process in processes:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Clients:
    """Client processes, each waiting on its stdin for the next thing to fetch."""

    def __init__(self, argv_of: list[list[str]], env: dict[str, str] | None = None) -> None:
        # One at a time: shardcast's clients all probe their servers through /tmp/dummy.bin.
        self.processes = []
        for argv in argv_of:
            process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            self.processes.append(process)
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":  # its imports are done
                raise RuntimeError("a client did not start")

    def send(self, line: str) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(line + "\n")
            process.stdin.flush()

    def results(self) -> list[dict[str, Any]]:
        found = []
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("a client died")
            found.append(json.loads(line))
        return found

    def close(self) -> None:
        for process in self.processes:
            if process.stdin is not None:
                process.stdin.close()
        for process in self.processes:
            process.wait(30)


def start(argv: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, text=True
    )
    wait_listening(port)
    return process


def stop(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


# ----------------------------------------------------------------------------------- rollnet
class RollnetTree:
    """rollnet relay --origin, two rollnet relay --upstream, client processes."""

    def __init__(self, root: Path, clients: int) -> None:
        self.root = root
        self.origin_dir = root / "origin"
        (self.origin_dir / "blobs").mkdir(parents=True, exist_ok=True)
        ports = [free_port() for _ in range(3)]
        origin = f"http://127.0.0.1:{ports[0]}"
        self.processes = [
            start(
                [*_RELAY, "--origin", str(self.origin_dir), "--listen", f"127.0.0.1:{ports[0]}"],
                ports[0],
            )
        ]
        self.relays = []
        for index, port in enumerate(ports[1:]):
            self.processes.append(
                start(
                    [
                        *_RELAY,
                        "--upstream",
                        origin,
                        "--listen",
                        f"127.0.0.1:{port}",
                        "--data-dir",
                        str(root / f"relay{index}"),
                        "--keep-versions",
                        "8",
                    ],
                    port,
                )
            )
            self.relays.append(f"http://127.0.0.1:{port}")
        self.clients = Clients(
            [
                [
                    _PYTHON,
                    __file__,
                    "--client-role",
                    "rollnet",
                    "--relays",
                    ",".join(self.relays),
                    "--client-dir",
                    str(root / f"client{index}"),
                ]
                for index in range(clients)
            ]
        )

    async def publish(
        self, model: Path, step: int, base: tuple[int, Path] | None
    ) -> tuple[Path, int]:
        from rollnet.reference.checkpoint_publishing import (
            DeltaBase,
            build_manifest,
            signed_checkpoint,
            write_origin_blob,
        )
        from rollnet.sdk.identity import Identity

        async def sink(data: bytes, digest: bytes) -> bool:
            await asyncio.to_thread(write_origin_blob, self.origin_dir, data, digest)
            return False

        manifest, counts = await build_manifest(
            model,
            step,
            "rollnet-bench",
            sink,
            delta_base=DeltaBase(*base) if base else None,
        )
        checkpoint = signed_checkpoint(Identity.generate(), manifest)
        path = self.root / f"checkpoint-{step}.pb"
        path.write_bytes(checkpoint.SerializeToString())
        return path, counts.delta_bytes

    def run(self, model: Path, step: int, base: tuple[int, Path] | None = None) -> dict[str, Any]:
        import rollnet.reference.checkpoint_publishing  # noqa: F401 - imported before the clock starts

        everyone = self.processes + self.clients.processes
        cpu = cpu_seconds(everyone) + own_cpu_seconds()
        started = time.time()
        path, delta_bytes = asyncio.run(self.publish(model, step, base))
        published = time.time()
        self.clients.send(str(path))
        results = self.clients.results()
        cpu = cpu_seconds(everyone) + own_cpu_seconds() - cpu
        return summary(started, published, results) | {"delta_bytes": delta_bytes, "cpu_s": cpu}

    def close(self) -> None:
        self.clients.close()
        stop(self.processes)


def rollnet_client(relays: str, client_dir: Path, stdin: TextIO) -> None:
    """A client process: for each checkpoint file named on stdin, fetch it into its store."""
    from rollnet.sdk.broadcast import RelayShards
    from rollnet.sdk.checkpoints import CheckpointStore
    from rollnet.v1 import checkpoint_pb2

    store = CheckpointStore(client_dir, network_id="rollnet-bench", keep=8)
    print("ready", flush=True)
    for line in stdin:
        checkpoint = checkpoint_pb2.Checkpoint.FromString(Path(line.strip()).read_bytes())

        async def fetch(checkpoint: checkpoint_pb2.Checkpoint = checkpoint) -> float | None:
            async with RelayShards(
                relays.split(","), partial_dir=client_dir / ".partial"
            ) as shards:
                await store.ensure(checkpoint, shards)
                return shards.first_byte_at

        before = store.delta_files
        first = asyncio.run(fetch())
        print(
            json.dumps(
                {
                    "done": time.time(),
                    "first_byte": first,
                    "delta_files": store.delta_files - before,
                }
            ),
            flush=True,
        )


# --------------------------------------------------------------------------------- shardcast
# Its clients retry a shard a middle node does not hold yet after 2 s, 2 s, 2 s, 15 s and 15 s;
# here after 1 s each time (kinder to it: they poll sooner).
_SHARDCAST_ENV = {
    "SHARDCAST_LOG_LEVEL": "WARNING",
    "SHARDCAST_FAST_RETRY_INTERVAL": "1",
    "SHARDCAST_SLOW_RETRY_INTERVAL": "1",
}


class ShardcastTree:
    """shardcast's OriginServer, two MiddleNodes (check_interval 1 s), ClientNode processes."""

    def __init__(self, root: Path, clients: int) -> None:
        env = os.environ | _SHARDCAST_ENV
        ports = [free_port() for _ in range(3)]
        # Every shardcast server must hold data1.bin: its downloaders time it at start-up.
        for name in ("origin", "middle0", "middle1"):
            (root / name).mkdir(parents=True, exist_ok=True)
            (root / name / "data1.bin").write_bytes(os.urandom(_MIB))
        self.origin_port = ports[0]
        self.origin = subprocess.Popen(
            [
                _PYTHON,
                __file__,
                "--client-role",
                "shardcast-origin",
                "--client-dir",
                str(root / "origin"),
                "--port",
                str(ports[0]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.origin.stdout is not None
        if self.origin.stdout.readline().strip() != "ready":
            raise RuntimeError("shardcast origin did not start")
        code = (
            "import sys,time; from shardcast import MiddleNode; "
            "MiddleNode([sys.argv[1]], sys.argv[2], int(sys.argv[3]), check_interval=1); "
            "time.sleep(10**6)"
        )
        self.middles = [
            start(
                [
                    _PYTHON,
                    "-c",
                    code,
                    f"http://127.0.0.1:{ports[0]}",
                    str(root / f"middle{i}"),
                    str(port),
                ],
                port,
                env,
            )
            for i, port in enumerate(ports[1:])
        ]
        servers = ",".join(f"http://127.0.0.1:{port}" for port in ports[1:])
        self.clients = Clients(
            [
                [
                    _PYTHON,
                    __file__,
                    "--client-role",
                    "shardcast",
                    "--relays",
                    servers,
                    "--client-dir",
                    str(root / f"client{index}"),
                ]
                for index in range(clients)
            ],
            env,
        )

    def run(self, weights: Path) -> dict[str, Any]:
        assert self.origin.stdin is not None
        assert self.origin.stdout is not None
        everyone = [self.origin, *self.middles, *self.clients.processes]
        cpu = cpu_seconds(everyone)
        started = time.time()
        self.origin.stdin.write(str(weights) + "\n")
        self.origin.stdin.flush()
        version = self.origin.stdout.readline().strip()
        published = time.time()
        self.clients.send(version)
        results = self.clients.results()
        cpu = cpu_seconds(everyone) - cpu
        return summary(started, published, results) | {"cpu_s": cpu}

    def close(self) -> None:
        self.clients.close()
        assert self.origin.stdin is not None
        self.origin.stdin.close()
        self.origin.wait(30)
        stop(self.middles)


def shardcast_origin(data_dir: Path, port: int, stdin: TextIO) -> None:
    import shardcast

    shardcast.initialize(str(data_dir), port=port)
    print("ready", flush=True)
    for line in stdin:
        print(shardcast.broadcast(line.strip()), flush=True)
    shardcast.shutdown()


def _own_distribution_file(downloader: Any, client_dir: Path) -> None:
    """Make shardcast's downloader keep the distribution listing it fetches in ``client_dir``.

    shardcast 0.3.2 downloads it to one path beside its package, shared by every client
    process of the machine, and deletes it after reading: a client whose file another deleted
    first dies (FileNotFoundError, seen here with 8 clients). The same steps, in a file of its
    own."""
    from shardcast.envs import SHARDCAST_DISTRIBUTION_FILE

    def download_distribution_file() -> str | None:
        temp = client_dir / "temp_distribution.txt"
        if not downloader.download_file(
            SHARDCAST_DISTRIBUTION_FILE, str(temp), update_metrics=False, log_error_on_failure=False
        ):
            return None
        content = temp.read_text()
        temp.unlink()
        return content

    downloader.download_distribution_file = download_distribution_file


def shardcast_client(servers: str, client_dir: Path, stdin: TextIO) -> None:
    import threading

    from shardcast import ClientNode

    client = ClientNode(servers.split(","), str(client_dir))
    _own_distribution_file(client.downloader, client_dir)
    print("ready", flush=True)
    for line in stdin:
        version = line.strip()
        first: list[float] = []
        done = threading.Event()

        def watch(
            version: str = version, first: list[float] = first, done: threading.Event = done
        ) -> None:  # shardcast has no hook: watch its temporary shard folder
            folder = client_dir / f"temp_{version}"
            while not done.is_set() and not first:
                if folder.is_dir() and any(
                    p.stat().st_size > 0 for p in folder.iterdir() if p.is_file()
                ):
                    first.append(time.time())
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # Wait until every server lists the version: a client that reads the listing of one
        # middle node that has it and then of one that has not yet falls into shardcast's shard
        # discovery, which asks for shards that do not exist, forever.
        deadline = time.monotonic() + 900
        while not all(_lists(server, version) for server in servers.split(",")):
            if time.monotonic() > deadline:
                raise SystemExit("shardcast servers never listed the version")
            time.sleep(0.05)
        # Then ask again until the version is whole (a middle node lists a version before it
        # holds the shards).
        while client.download_version(version) is None:
            if time.monotonic() > deadline:
                raise SystemExit("shardcast client failed")
            time.sleep(0.05)
        done.set()
        watcher.join()
        print(
            json.dumps({"done": time.time(), "first_byte": first[0] if first else None}), flush=True
        )


def _lists(server: str, version: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{server}/distribution.txt", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return False
    return any(line.split(":", 1)[0].strip() == version for line in text.splitlines())


# ----------------------------------------------------------------------------------- figures
def summary(started: float, published: float, results: list[dict[str, Any]]) -> dict[str, Any]:
    done = max(r["done"] for r in results)
    firsts = [r["first_byte"] for r in results if r["first_byte"] is not None]
    return {
        "total_s": done - started,
        "publish_s": published - started,
        "first_byte_s": (min(firsts) - started) if firsts else float("nan"),
        "delta_files": sum(r.get("delta_files", 0) for r in results),
    }


def delta_figures(
    root: Path, args: argparse.Namespace
) -> tuple[list[Path], list[dict[str, float]]]:
    from rollnet.reference.model.tiny import TinyModelSpec
    from rollnet.reference.trainer.config import TrainerConfig
    from rollnet.reference.trainer.synthetic_steps import write_trainer_steps
    from rollnet.sdk.broadcast.delta import encode_delta

    spec = TinyModelSpec(
        hidden_size=args.delta_hidden,
        intermediate_size=4 * args.delta_hidden,
        num_hidden_layers=args.delta_layers,
        num_attention_heads=max(4, args.delta_hidden // 64),
        num_key_value_heads=max(2, args.delta_hidden // 128),
    )
    config = TrainerConfig(**({"learning_rate": args.lr} if args.lr is not None else {}))
    steps = write_trainer_steps(root / "steps", args.delta_steps, spec=spec, config=config)
    rows = []
    for number in range(1, len(steps)):
        base, target = steps[number - 1] / "model.safetensors", steps[number] / "model.safetensors"
        stats = encode_delta(base, target, root / "delta")
        rows.append(
            {
                "step": number,
                "unchanged": stats.unchanged_fraction,
                "full": stats.size,
                "delta": stats.delta_bytes,
            }
        )
    return steps, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="checkpoint size in MiB (default 512)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--no-shardcast", action="store_true", help="rollnet only")
    parser.add_argument("--no-deltas", action="store_true", help="the full checkpoint only")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate the two systems this many times"
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="the trainer's learning rate for the delta steps (default: TrainerConfig's)",
    )
    parser.add_argument("--delta-steps", type=int, default=3)
    parser.add_argument("--delta-hidden", type=int, default=512)
    parser.add_argument("--delta-layers", type=int, default=4)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="scratch (default: a temporary dir)"
    )
    parser.add_argument("--client-role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--relays", default="", help=argparse.SUPPRESS)
    parser.add_argument("--client-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_role == "rollnet":
        rollnet_client(args.relays, args.client_dir, sys.stdin)
        return 0
    if args.client_role == "shardcast":
        shardcast_client(args.relays, args.client_dir, sys.stdin)
        return 0
    if args.client_role == "shardcast-origin":
        shardcast_origin(args.client_dir, args.port, sys.stdin)
        return 0

    if not args.no_shardcast and args.mib * _MIB <= _SHARDCAST_SHARD:
        # Seen at --mib 32: a version of one shard sends shardcast's clients into its shard
        # discovery, asking for shards 2-10 that do not exist, until the bench's deadline.
        parser.error(
            f"shardcast cuts {_SHARDCAST_SHARD:,} B shards and its clients never finish a "
            "version of one shard: give a larger --mib (128 was seen to work) or --no-shardcast"
        )
    with tempfile.TemporaryDirectory(prefix="rollnet-broadcast-", dir=args.workdir) as scratch:
        root = Path(scratch)
        size = args.mib * _MIB
        model = write_model(root / "model", size)
        weights = model / "model.safetensors"
        copies = 2 + args.clients
        plain = plain_copies(weights, root / "plain", copies)
        print(f"checkpoint: {args.mib} MiB; topology: 1 origin, 2 relays, {args.clients} clients")
        rate = copies * size / plain / _MIB
        print(
            f"plain local copies: {copies} x {args.mib} MiB in {plain:.2f} s "
            f"({rate:,.0f} MiB/s, the machine's limit)"
        )

        def report(name: str, figures: dict[str, Any]) -> None:
            total, first = figures["total_s"], figures["first_byte_s"]
            after = first - figures["publish_s"]
            print(
                f"{name:<10} total {total:6.2f} s (publish {figures['publish_s']:.2f} s)  "
                f"first byte at a leaf {first:.2f} s ({first / total:.1%} of total; "
                f"{after:.2f} s after publishing, {after / total:.1%})  "
                f"aggregate {copies * size / total / _MIB:,.0f} MiB/s "
                f"({plain / total:.0%} of plain copies); CPU {figures['cpu_s']:.1f} s "
                f"({figures['cpu_s'] * _MIB / (copies * size) * 1e3:.2f} ms per MiB landed)"
            )

        ratios = []
        for repeat in range(args.repeats):  # alternating, so load on the machine hits both
            if args.repeats > 1:
                print(f"run {repeat + 1} of {args.repeats}")
            tree = RollnetTree(root / "rollnet", args.clients)
            try:
                settle()
                ours = tree.run(model, 1)
            finally:
                tree.close()
            report("rollnet", ours)
            shutil.rmtree(root / "rollnet")
            if args.no_shardcast:
                continue
            baseline = ShardcastTree(root / "shardcast", args.clients)
            try:
                settle()
                theirs = baseline.run(weights)
            finally:
                baseline.close()
            report("shardcast", theirs)
            ratios.append(theirs["total_s"] / ours["total_s"])
            print(f"rollnet is {ratios[-1]:.2f}x faster than shardcast 0.3.2 (full checkpoint)")
            shutil.rmtree(root / "shardcast")
        if len(ratios) > 1:
            print(
                f"median over {len(ratios)} runs: rollnet {statistics.median(ratios):.2f}x faster "
                f"(each: {', '.join(f'{r:.2f}x' for r in ratios)})"
            )

        if args.no_deltas:
            return 0
        from rollnet.reference.trainer.config import TrainerConfig

        defaults = TrainerConfig()
        lr = args.lr if args.lr is not None else defaults.learning_rate
        print(
            f"\ndeltas: steps of the reference trainer (its Learner and export_checkpoint; "
            f"TrainerConfig defaults: lr {lr:g}, loss {defaults.loss.kind}, grad clip "
            f"{defaults.grad_clip:g}, {defaults.batch_groups} groups x {defaults.group_size} "
            f"seeded synthetic rollouts, float32 master weights, bf16 published) of a Qwen2 "
            f"model, hidden {args.delta_hidden}, {args.delta_layers} layers"
        )
        steps, rows = delta_figures(root / "deltas", args)
        for row in rows:
            print(
                f"  step {row['step']}: {row['unchanged']:.2%} of bf16 weights bit-identical; "
                f"delta {row['delta'] / _MIB:.2f} MiB of {row['full'] / _MIB:.2f} MiB "
                f"(delta/full {row['delta'] / row['full']:.4f}, 1/{row['full'] / row['delta']:.0f})"
            )
        last = len(steps) - 1
        if rows[-1]["delta"] * 2 > rows[-1]["full"]:
            print(
                f"  step {last}: the delta is more than half the file, so none is published "
                "(nodes fetch the full checkpoint); no end-to-end delta step to time"
            )
            return 0
        tree = RollnetTree(root / "rollnet-delta", args.clients)
        try:
            for number in range(last):  # the clients follow every step before the last
                tree.run(steps[number], number, (number - 1, steps[number - 1]) if number else None)
            delta = tree.run(steps[last], last, (last - 1, steps[last - 1]))
        finally:
            tree.close()
        fresh = RollnetTree(root / "rollnet-full", args.clients)
        try:
            whole = fresh.run(steps[last], last, (last - 1, steps[last - 1]))
        finally:
            fresh.close()
        if delta["delta_files"] < args.clients or whole["delta_files"] != 0:
            raise RuntimeError(f"clients did not take the path measured: {delta}, {whole}")
        print(
            f"  end to end, step {last} to {args.clients} clients: as a delta "
            f"{delta['total_s']:.2f} s (publish {delta['publish_s']:.2f} s), whole "
            f"{whole['total_s']:.2f} s (publish {whole['publish_s']:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
