"""End to end on loopback: a coordinator, one honest worker (``rollnet worker`` process), one
adversarial worker per attack class and two validators at once (a ``rollnet validator`` process
and a :class:`~rollnet.reference.validator.Validator` in the test process).

Two cheaters run as real processes (``python -m rollnet.reference.adversary``); the other four
run the same worker runtime inside the test process, against the same coordinator, which spares
the 2-core CI machine four more torch start-ups.

The honest worker's work is all accepted and credited; each cheater's work is rejected by the
check its attack class is caught by, slashed, and the cheater is EJECTED after
``eject_after_rejects`` rejects (its process then exits 1); every commitment has at most one
verdict; ``rollnet ledger verify`` passes afterwards.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from swarm_testing import Ledger
from validator_testing import (
    coordinator_config_for,
    request_tasks,
    rollnet,
    spawn,
    start_trainer,
    stop,
)

from rollnet.ledger.enums import NodeState, TaskState
from rollnet.reference.adversary import CHEATS, Cheat, build_cheating_worker
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.testing import in_process_validator
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, free_port, wait_until
from rollnet.sdk.worker import Backoff, WorkerConfig, WorkerFatalError

EJECT_AFTER = 2
# One cheat per attack class (the check that catches it); the pipeline tests cover the rest.
PROCESS_CHEATS = (Cheat.PERTURBED_WEIGHTS, Cheat.PROOF_REUSED)  # toploc, binding
IN_PROCESS_CHEATS = (
    Cheat.TOKEN_ALTERED,  # sampling
    Cheat.TRUNCATED,  # termination
    Cheat.EASIER_PROMPTS,  # assigned_data
    Cheat.REWARD_INFLATED,  # reward
)


def first_failure(figures: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in figures["checks"] if not c["passed"])


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_honest_work_is_credited_and_every_cheater_is_ejected(
    tmp_path: Path, sqlite_url: str, tiny_model: Path
) -> None:
    trainer, validator, second = Identity.generate(), Identity.generate(), Identity.generate()
    config = coordinator_config_for(
        tmp_path,
        sqlite_url,
        trainer,
        validator,
        eject_after_rejects=EJECT_AFTER,
        validators=frozenset({validator.node_id, second.node_id}),
    )
    coordinator = await start_coordinator(config)
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(address, trainer, tiny_model)
    processes: list[subprocess.Popen[bytes]] = []
    cheaters: dict[Cheat, tuple[Identity, subprocess.Popen[bytes] | asyncio.Task[None]]] = {}
    common = ["--coordinator", address, "--network-id", NETWORK_ID, "--pull-wait", "1"]
    validator_in_process = in_process_validator(address, tmp_path / "v2", second)
    validating = asyncio.create_task(validator_in_process.run())

    def node(name: str, identity: Identity | None = None) -> tuple[Path, Identity]:
        key = tmp_path / f"{name}.key"
        identity = identity or Identity.generate()
        identity.save(key)
        return key, identity

    try:
        key, _ = node("validator", validator)
        metrics_port = free_port()
        validator_process = spawn(
            rollnet(
                "validator",
                "--key",
                str(key),
                "--data-dir",
                str(tmp_path / "v"),
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
                *common,
            ),
            tmp_path / "validator.log",
        )
        processes.append(validator_process)
        key, honest = node("honest")
        honest_process = spawn(
            rollnet("worker", "--key", str(key), "--data-dir", str(tmp_path / "h"), *common),
            tmp_path / "honest.log",
        )
        processes.append(honest_process)
        for cheat in IN_PROCESS_CHEATS:
            identity = Identity.generate()
            worker = build_cheating_worker(
                cheat,
                WorkerConfig(
                    target=address,
                    data_dir=tmp_path / cheat.value,
                    network_id=NETWORK_ID,
                    pull_wait=1.0,
                    backoff=Backoff(initial=0.1, maximum=1.0),
                    drain_timeout=5.0,
                    deregister_timeout=3.0,
                ),
                identity,
            )
            cheaters[cheat] = (identity, asyncio.create_task(worker.run()))
        for cheat in PROCESS_CHEATS:
            key, identity = node(cheat.value)
            process = spawn(
                [
                    "rollnet.reference.adversary",
                    "--cheat",
                    cheat.value,
                    "--key",
                    str(key),
                    "--data-dir",
                    str(tmp_path / cheat.value),
                    *common,
                ],
                tmp_path / f"{cheat.value}.log",
            )
            cheaters[cheat] = (identity, process)
            processes.append(process)

        async def progress() -> bool:
            # Keep a few tasks queued so every cheater gets enough work to be ejected.
            if ledger.tasks_in(TaskState.QUEUED) < 2:
                await request_tasks(trainer_client, 4)
            for process in (validator_process, honest_process):
                assert process.poll() is None, f"a node process died; see the logs in {tmp_path}"
            verdicts = ledger.verdicts_by_node()
            ejected = all(
                ledger.node_state(identity.node_id) is NodeState.EJECTED
                for identity, _ in cheaters.values()
            )
            # Both validators must have judged work (on a loaded machine one of them may be
            # slow to start and the other take every job at first: keep work coming).
            judging = set(ledger.verdicts_by_validator()) == {validator.node_id, second.node_id}
            return ejected and judging and len(verdicts.get(honest.node_id, [])) >= 2

        await wait_until(
            progress, within=240, what="every cheater ejected, honest work judged by both"
        )

        verdicts = ledger.verdicts_by_node()
        # The honest worker: everything accepted and credited.
        honest_verdicts = verdicts[honest.node_id]
        assert all(accepted for accepted, _, _ in honest_verdicts), honest_verdicts
        assert ledger.balance(honest.node_id, "credit") > 0
        assert ledger.balance(honest.node_id, "slash") == 0
        assert ledger.node_state(honest.node_id) is not NodeState.EJECTED

        # Each cheater: every verdict a reject naming the first failing check's reason, with
        # its attack class's check among the failures; slashed; ejected; it stops (exit 1).
        # (Commitments submitted before the ejection are judged too: at least EJECT_AFTER.)
        for cheat, (identity, runner) in cheaters.items():
            judged = verdicts[identity.node_id]
            assert len(judged) >= EJECT_AFTER, (cheat, judged)
            for accepted, reasons, figures in judged:
                assert not accepted
                failed = {c["check"] for c in figures["checks"] if not c["passed"]}
                assert CHEATS[cheat].caught_by in failed, (cheat, failed)
                assert reasons == (first_failure(figures)["reason"],)
            assert ledger.balance(identity.node_id, "slash") < 0
            assert ledger.balance(identity.node_id, "credit") == 0
            if isinstance(runner, asyncio.Task):
                with pytest.raises(WorkerFatalError, match="NODE_EJECTED"):
                    await asyncio.wait_for(runner, 30)
            else:
                assert await asyncio.to_thread(runner.wait, 30) == 1, cheat

        # Both validators judged work; the process's Prometheus metrics count what the ledger
        # records for it.
        by_validator = ledger.verdicts_by_validator()
        assert set(by_validator) == {validator.node_id, second.node_id}, by_validator.keys()
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        scraped = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(scraped.decode())
            for sample in family.samples
        }
        mine = by_validator[validator.node_id]
        rejected = [reasons[0] for accepted, reasons in mine if not accepted]
        decisions = {"accept": len(mine) - len(rejected), "reject": len(rejected)}
        for decision, count in decisions.items():
            assert samples.get(("rollnet_validator_jobs_total", (("decision", decision),)), 0) == (
                count
            )
        for reason in set(rejected):
            key_ = ("rollnet_validator_rejects_total", (("reason", reason),))
            assert samples[key_] == rejected.count(reason)
        assert samples[("rollnet_validator_validated_tokens_total", (("kind", "completion"),))] > 0

        # One verdict per commitment.
        assert set(ledger.verdicts_per_commitment().values()) == {1}

        # Drain: SIGTERM makes the honest worker and the validator exit 0.
        # (Off the event loop: the coordinator serves from it meanwhile.)
        assert await asyncio.to_thread(stop, honest_process) == 0
        assert await asyncio.to_thread(stop, validator_process) == 0
        validator_in_process.request_stop()
        await asyncio.wait_for(validating, 30)
        assert ledger.node_state(second.node_id) is NodeState.DEREGISTERED
        verify = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", *rollnet("ledger", "verify", "--db", sqlite_url)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        validator_in_process.request_stop()
        if not validating.done():
            await asyncio.wait({validating}, timeout=30)
        for _, runner in cheaters.values():
            if isinstance(runner, asyncio.Task):
                runner.cancel()
        for process in processes:
            await asyncio.to_thread(stop, process, timeout=10)
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()
