"""Make docs/dashboard.png, the README's picture of the operator dashboard.

Starts a coordinator in this process (SQLite in a temporary directory) with its dashboard on
loopback, plays a small swarm against it through the protocol — six workers, a validator and a
trainer over twelve trainer steps, the reward rising, a few rejects — and photographs the page
in Debian's chromium (headless, driven by playwright)::

    python scripts/dashboard_screenshot.py docs/dashboard.png

It uses the test suite's protocol helpers (tests/support), as the dashboard's browser test
does, so the picture shows what the tests check.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "support")]

from coordinator_testing import (  # noqa: E402
    judge_next_job,
    publish_checkpoint,
    pull_and_commit,
    register,
    request_tasks,
)
from dashboard_testing import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from playwright.async_api import async_playwright  # noqa: E402

from rollnet.reference.coordinator.config import load_config, with_overrides  # noqa: E402
from rollnet.reference.coordinator.server import start_coordinator  # noqa: E402
from rollnet.sdk import Identity  # noqa: E402
from rollnet.sdk.testing import connect  # noqa: E402
from rollnet.v1 import common_pb2, node_service_pb2  # noqa: E402

REJECTS = {3: "EXPONENT_MISMATCH", 7: "SAMPLING_MISMATCH", 10: "EXPONENT_MISMATCH"}


async def play(address: str, trainer: Identity, validator: Identity) -> None:
    workers = [Identity.generate() for _ in range(6)]
    clients = [connect(address, worker) for worker in workers]
    trainer_client = connect(address, trainer)
    validator_client = connect(address, validator)
    try:
        for client, worker in zip(clients, workers, strict=True):
            await register(client, worker, common_pb2.ROLE_WORKER)
        await register(trainer_client, trainer, common_pb2.ROLE_TRAINER)
        await register(validator_client, validator, common_pb2.ROLE_VALIDATOR)
        for step in range(1, 13):
            if step % 4 == 1:
                await publish_checkpoint(trainer_client, trainer, step=step // 4 + 1)
            await request_tasks(trainer_client, 3, samples_per_prompt=4, step=step)
            for index in range(3):
                client, worker = clients[(step + index) % 6], workers[(step + index) % 6]
                await pull_and_commit(client, worker)
                reason = REJECTS.get(step) if index == 0 else None
                reward = min(0.95, 0.08 * step + 0.03 * index)
                await judge_next_job(validator_client, reason is None, reason or "", reward=reward)
                if reason is not None:  # the rejected task's copy, done honestly
                    await pull_and_commit(clients[0], workers[0])
                    await judge_next_job(validator_client, True, reward=reward)
        for index, client in enumerate(clients):  # the broadcast of step 3 is under way
            step = 3 if index < 4 else 2
            await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=step))
        await validator_client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=3))
    finally:
        for client in (*clients, trainer_client, validator_client):
            await client.close()


async def main(out: Path) -> None:
    trainer, validator = Identity.generate(), Identity.generate()
    with tempfile.TemporaryDirectory() as directory:
        config = with_overrides(
            load_config(Path(directory)),
            listen="127.0.0.1:0",
            dashboard_listen="127.0.0.1:0",
            network_id="rollnet-test",
            trainers=frozenset({trainer.node_id}),
            validators=frozenset({validator.node_id}),
            trusted_streak=1000,
        )
        coordinator = await start_coordinator(config)
        try:
            await play(coordinator.address, trainer, validator)
            assert coordinator.dashboard is not None
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                page = await browser.new_page(viewport={"width": 1400, "height": 1250})
                await page.goto(coordinator.dashboard.url)
                # (The page's Content-Security-Policy forbids evaluating strings: CSS waits only.)
                await page.wait_for_selector('#chart-reward .uplot[data-points="12"]')
                await page.wait_for_selector("#nodes tbody tr")
                await page.screenshot(path=str(out), full_page=True)
                await browser.close()
        finally:
            await coordinator.stop(grace=0.5)
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png")))
