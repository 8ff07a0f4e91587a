"""The operator dashboard in a real browser (Debian's chromium, driven by playwright) against a
running coordinator with nodes and work: what it shows, that it updates, and that beyond
loopback it needs an operator's signed login."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from dashboard_testing import CHROMIUM_ARGS, make_history, need_chromium
from playwright.async_api import Browser, Page, Request, async_playwright
from playwright.async_api import Error as PlaywrightError

from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.dashboard_login import login_query
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.v1 import node_service_pb2

DEADLINE = 20.0


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = need_chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(executable), args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def dashboard_coordinator(
    coordinator_config: CoordinatorConfig,
) -> AsyncIterator[Coordinator]:
    config = with_overrides(coordinator_config, dashboard_listen="127.0.0.1:0")
    with structlog.testing.capture_logs():
        running = await start_coordinator(config)
        try:
            yield running
        finally:
            await running.stop(grace=0.5)


async def _text(page: Page, selector: str) -> str:
    return (await page.locator(selector).inner_text()).strip()


async def _field(page: Page, list_id: str, key: str) -> str:
    return await _text(page, f'#{list_id} dd[data-key="{key}"]')


async def _shows(page: Page, list_id: str, key: str, value: str) -> bool:
    locator = page.locator(f'#{list_id} dd[data-key="{key}"]')
    return await locator.count() == 1 and (await locator.inner_text()).strip() == value


@pytest.mark.slow
async def test_dashboard_shows_the_swarm_and_updates(
    dashboard_coordinator: Coordinator,
    browser: Browser,
    trainer_identity: Identity,
    validator_identity: Identity,
) -> None:
    coordinator = dashboard_coordinator
    assert coordinator.dashboard is not None
    swarm = await make_history(coordinator.address, trainer_identity, validator_identity)
    try:
        page = await browser.new_page()
        dashboard_url = coordinator.dashboard.url
        errors: list[str] = []
        outside: list[str] = []  # every request must go to the dashboard itself

        def on_error(error: PlaywrightError) -> None:
            errors.append(str(error))

        def on_request(request: Request) -> None:
            if not request.url.startswith(dashboard_url):
                outside.append(request.url)

        page.on("pageerror", on_error)
        page.on("request", on_request)
        await page.goto(dashboard_url)

        async def loaded() -> bool:
            return await _shows(page, "tasks-by-state", "accepted", "3")

        await wait_until(loaded, within=DEADLINE, what="the page to show the accepted tasks")
        assert await _text(page, "#network-id") == NETWORK_ID
        assert await _text(page, "#nodes-total") == "3"  # worker, validator, trainer
        assert await _field(page, "tasks-by-state", "rejected") == "1"
        assert await _field(page, "tasks-by-state", "queued") == "0"
        assert await _field(page, "validation", "accepted") == "3"
        assert await _field(page, "validation", "rejected") == "1"
        rejects = await _text(page, "#rejects tbody")
        assert "EXPONENT_MISMATCH" in rejects
        # The ledger: 3 credits + 1 slash + 4 validator rewards.
        assert await _field(page, "ledger", "entries") == "8"
        # The reward chart has step 1's point; the throughput charts count this minute's work.
        reward_chart = page.locator("#chart-reward .uplot")
        assert await reward_chart.get_attribute("data-points") == "1"
        assert await reward_chart.get_attribute("data-last") == "1"
        verdicts = page.locator("#chart-verdicts .uplot")
        assert await verdicts.get_attribute("data-points") == "120"
        # Broadcast: the worker reports step 1 (the latest), the validator step 0.
        assert await _text(page, "#latest-step") == "1"
        assert await _text(page, "#at-latest") == "1"
        assert await _text(page, "#live-nodes") == "2"
        assert await _text(page, "#counted-at") == "1"
        assert await _text(page, "#within-one") == "2"
        worker_row = page.locator(f'#nodes tr[data-node-id="{swarm.worker.node_id}"]')
        await wait_until(worker_row.count, within=DEADLINE, what="the worker's row")
        cells = [c.strip() for c in await worker_row.locator("td").all_inner_texts()]
        assert cells[1:3] == ["worker", "active"]
        assert cells[4] == "1"  # its checkpoint step
        assert int(cells[5].replace(",", "")) > 0  # its credits
        validator_row = page.locator(f'#nodes tr[data-node-id="{validator_identity.node_id}"]')
        assert "1 behind" in (await validator_row.locator("td").all_inner_texts())[4]

        # A relay the worker reports for a bad shard shows up with who reported it.
        assert await _text(page, "#relay-note") == "no relay reported serving wrong shard bytes"
        await swarm.worker_client.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(
                checkpoint_step=1,
                relay_reports=[
                    node_service_pb2.RelayReport(
                        relay_url="http://relay.example:7090",
                        shard_blake3=bytes(range(32)),
                        checkpoint_step=1,
                    )
                ],
            )
        )
        relay_row = page.locator('#relay-reports tr[data-relay="http://relay.example:7090"]')
        await wait_until(relay_row.count, within=DEADLINE, what="the reported relay's row")
        cells = [c.strip() for c in await relay_row.locator("td").all_inner_texts()]
        assert cells[1:4] == ["1", "1", f"{bytes(range(32)).hex()[:16]}… (1)"]
        assert cells[4] == swarm.worker.node_id[:12]

        # Live: one more accepted task shows up without reloading the page.
        before = await page.evaluate("document.body.dataset.generatedAt")
        await swarm.accept_one_more()

        async def updated() -> bool:
            return await _shows(page, "tasks-by-state", "accepted", "4")

        await wait_until(updated, within=DEADLINE, what="the page to show the new task")
        assert await page.evaluate("document.body.dataset.generatedAt") != before

        async def new_step() -> bool:  # the reward curve is re-read every few seconds
            return await reward_chart.get_attribute("data-points") == "2"

        await wait_until(new_step, within=DEADLINE, what="step 2 on the reward chart")
        # Filtering the node list by role is answered by the server.
        await page.select_option("#filter-role", "validator")

        async def filtered() -> bool:
            rows = await page.locator("#nodes tbody tr").count()
            return rows == 1 and await validator_row.count() == 1

        await wait_until(filtered, within=DEADLINE, what="the node list filtered by role")
        assert errors == []
        assert outside == []
    finally:
        await swarm.close()


async def _get(url: str) -> tuple[int, str]:
    """GET ``url`` without cookies (in a thread: the server runs on this event loop)."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    return await asyncio.to_thread(get)


@pytest.mark.slow
async def test_beyond_loopback_an_operator_logs_in_with_a_signed_link(
    coordinator_config: CoordinatorConfig,
    operator_identity: Identity,
    browser: Browser,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 0.0.0.0 is not loopback: every page but /login needs an operator session.
    config = replace(coordinator_config, dashboard_listen="0.0.0.0:0")
    with structlog.testing.capture_logs():
        coordinator = await start_coordinator(config)
    try:
        assert coordinator.dashboard is not None
        base = f"http://127.0.0.1:{coordinator.dashboard.port}"
        status, body = await _get(f"{base}/api/overview")
        assert status == 401
        status, body = await _get(f"{base}/")
        assert status == 401
        assert "rollnet dashboard login-url" in body

        # A link signed by a key that is not an operator's, or for another network, is refused.
        stranger = login_query(Identity.generate(), NETWORK_ID)
        assert (await _get(f"{base}/login?{stranger}"))[0] == 403
        other_network = login_query(operator_identity, "another-network")
        assert (await _get(f"{base}/login?{other_network}"))[0] == 403

        # The CLI signs a link with the operator's key; the browser follows it and is in.
        key = tmp_path / "operator.key"
        operator_identity.save(key)
        argv = ["dashboard", "login-url", "--key", str(key), "--url", base]
        assert cli_main([*argv, "--network-id", NETWORK_ID]) == 0
        link = capsys.readouterr().out.strip()
        page = await browser.new_page()
        await page.goto(link)
        assert page.url == f"{base}/"
        overview: dict[str, Any] = json.loads(
            await page.evaluate("fetch('/api/overview').then(r => r.text())")
        )
        assert overview["network_id"] == NETWORK_ID
        cookies = await page.context.cookies()
        session = next(c for c in cookies if c["name"] == "rollnet_dashboard")
        assert session["httpOnly"] is True
        assert session["sameSite"] == "Strict"
        # The link works once.
        assert (await _get(link))[0] == 403
    finally:
        await coordinator.stop(grace=0.5)
