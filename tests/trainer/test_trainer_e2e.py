"""End to end on loopback: ``rollnet trainer`` (a real process) against a coordinator, a worker
and a validator, killed with SIGKILL in the middle of its run and started again.

The trainer publishes checkpoint 0, then trains step after step on validated GRPO groups and
publishes each new checkpoint. After the SIGKILL it resumes from its committed state: every step
1..N appears exactly once in metrics.jsonl and on the coordinator, no rollout is trained on twice,
and only the last ``max_off_policy_steps + 1`` checkpoints stay on disk (one more in the origin
directory it writes for ``rollnet relay --origin``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from trainer_testing import alive, coordinator_config, kill_tree, spawn_trainer

from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.testing import in_process_validator, in_process_worker
from rollnet.reference.trainer.metrics import read_jsonl
from rollnet.sdk import Identity, RollnetError
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import checkpoint_service_pb2

STEPS = 4

CONFIG = """
environment = "reverse"
group_size = 4
batch_groups = 2
prompts_per_task = 2
max_new_tokens = 8
max_off_policy_steps = 0
max_steps = 4
learning_rate = 0.001
demand_timeout = 60.0

[loss]
kind = "mask"
"""


def _committed_step(data_dir: Path) -> int:
    path = data_dir / "state.json"
    if not path.exists():
        return 0
    try:
        return int(json.loads(path.read_text())["step"])
    except (ValueError, KeyError):
        return 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "fsdp2-two-processes"])
async def test_trainer_steps_publishes_and_resumes_after_sigkill(
    tmp_path: Path, sqlite_url: str, tiny_model: Path, processes: int
) -> None:
    """With ``processes=2`` the trainer runs under torchrun (FSDP2, gloo); it is killed as a
    whole and restarted the same way."""
    trainer_key = tmp_path / "trainer.key"
    trainer = Identity.generate()
    trainer.save(trainer_key)
    checker = Identity.generate()
    # Spot checks thin out after one accepted commitment: some rollouts reach the trainer
    # without the validator's log-probabilities or reward, which it then computes itself.
    coordinator = await start_coordinator(
        coordinator_config(
            tmp_path, sqlite_url, trainer, checker, trusted_streak=1, min_validation_rate=0.0
        )
    )
    address = coordinator.address
    config = tmp_path / "trainer.toml"
    config.write_text(CONFIG)
    data_dir = tmp_path / "trainer"
    log = tmp_path / "trainer.log"
    node, generator = in_process_worker(address, tmp_path / "worker")
    check = in_process_validator(address, tmp_path / "validator", checker)
    running = [asyncio.create_task(node.run()), asyncio.create_task(check.run())]
    origin = tmp_path / "origin"
    extra = ("--origin-dir", str(origin))
    process = spawn_trainer(
        address, trainer_key, tiny_model, data_dir, config, log, processes=processes, extra=extra
    )
    try:
        await wait_until(
            lambda: _committed_step(data_dir) >= 2 or process.poll() is not None,
            within=180,
            what="the trainer to commit step 2",
        )
        assert process.poll() is None, log.read_text()[-3000:]
        killed = kill_tree(process)
        # torchrun's workers too: a survivor would go on training beside the restarted trainer.
        await wait_until(
            lambda: not alive(killed), within=30, what="the trainer's processes to die"
        )
        killed_at = _committed_step(data_dir)
        assert killed_at < STEPS
        process = spawn_trainer(
            address,
            trainer_key,
            tiny_model,
            data_dir,
            config,
            log,
            processes=processes,
            extra=extra,
        )
        exit_code = await asyncio.to_thread(process.wait, 180)
        assert exit_code == 0, log.read_text()[-3000:]
        published = []
        async with connect(address, trainer) as client:
            for step in range(STEPS + 2):
                try:
                    got = await client.checkpoints.get_checkpoint(
                        checkpoint_service_pb2.GetCheckpointRequest(step=step)
                    )
                except RollnetError:
                    continue
                published.append(got.checkpoint.step)
    finally:
        if process.poll() is None:
            kill_tree(process)
        node.request_stop()
        check.request_stop()
        await asyncio.gather(*running, return_exceptions=True)
        generator.close()
        await coordinator.stop()
    lines = read_jsonl(data_dir / "metrics.jsonl")
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    trained = [s for line in lines for s in line["sequences"]]
    assert len(trained) == len(set(trained)), "a rollout was trained on twice"
    for line in lines:
        assert line["groups"] == 2
        assert line["samples"] == 8
        assert line["staleness"] == {"0": 2}
        # Every token's μ is the validator's or the trainer's own recomputation.
        assert line["validated_fraction"] + line["recomputed_fraction"] == pytest.approx(1.0)
        assert line["grad_norm"] > 0
    print("validated share per step:", [round(line["validated_fraction"], 2) for line in lines])
    assert json.loads((data_dir / "state.json").read_text())["step"] == STEPS
    # bf16 checkpoints, only the newest kept (max_off_policy_steps 0)
    assert sorted(p.name for p in (data_dir / "checkpoints").iterdir()) == [f"step-{STEPS}"]
    assert published == list(range(STEPS + 1))
    # The origin directory (rollnet relay --origin) holds the newest two checkpoints: the one
    # kept and the one before, which nodes may still be fetching.
    assert sorted(p.name for p in (origin / "checkpoints").iterdir()) == [
        f"step-{STEPS - 1}.pb",
        f"step-{STEPS}.pb",
    ]
    header = (data_dir / "checkpoints" / f"step-{STEPS}" / "model.safetensors").read_bytes()
    assert b'"BF16"' in header[:4096]
