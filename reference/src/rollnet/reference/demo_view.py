"""The demo's view of its swarm: what the operator dashboard shows, in the terminal.

The demo's coordinator serves its dashboard on a loopback port; :class:`SwarmWatch` polls the
same ``/api/overview`` the page polls (no query of its own) and shows it:

- on a terminal, a live panel (``rich``) under the trainer's step lines: the step, the mean task
  reward and its trend, nodes by state, tasks by state, rollouts validated and rejected by reason,
  the checkpoint broadcast (nodes on the latest checkpoint), ledger totals and the dashboard's
  address;
- otherwise (tests, CI, ``make demo | tee``), one plain ``swarm:`` line each time the trainer
  publishes a new checkpoint step.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

#: How often the overview is read (the dashboard page polls every 2 s).
POLL_SECONDS = 1.0
_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 30, low: float = 0.0, high: float = 1.0) -> str:
    """The last ``width`` values as block characters between ``low`` and ``high``."""
    span = (high - low) or 1.0
    shown = values[-width:]
    return "".join(
        _BARS[min(len(_BARS) - 1, max(0, int((v - low) / span * len(_BARS))))] for v in shown
    )


def trend(values: Sequence[float], window: int = 3) -> str:
    """An arrow comparing the mean of the last ``window`` values with the ``window`` before."""
    if len(values) < 2:
        return "·"
    recent = values[-window:]
    before = values[-2 * window : -window] or values[:1]
    delta = sum(recent) / len(recent) - sum(before) / len(before)
    if abs(delta) < 0.01:
        return "→"
    return "↗" if delta > 0 else "↘"


def _counts(mapping: dict[str, Any]) -> str:
    shown = {k: v for k, v in mapping.items() if isinstance(v, int) and v}
    return ", ".join(f"{k} {v}" for k, v in shown.items()) or "none"


def rewards_of(snapshot: dict[str, Any]) -> list[float]:
    """The mean task reward per rollout step, in step order."""
    rows = sorted(snapshot.get("rewards", []), key=lambda row: row["step"])
    return [float(row["mean_task_reward"]) for row in rows]


def summary_fields(
    snapshot: dict[str, Any], trainer_steps: Sequence[dict[str, Any]] = ()
) -> dict[str, str]:
    """The view's rows (label -> text) for one overview snapshot.

    ``trainer_steps`` (the trainer's ``metrics.jsonl`` lines), when given, are the step and its
    mean task reward (the figure the step lines print); otherwise the validated rewards the
    coordinator sums per rollout step.
    """
    rewards = (
        [float(line["task_reward"]) for line in trainer_steps]
        if trainer_steps
        else rewards_of(snapshot)
    )
    nodes = snapshot.get("nodes", {})
    tasks = {
        k: v for k, v in snapshot.get("tasks", {}).items() if k not in ("accepted", "rejected")
    }
    validation = snapshot.get("validation", {})
    reasons = validation.get("rejects_by_reason", {})
    checkpoints = snapshot.get("checkpoints", {})
    ledger = snapshot.get("ledger", {})
    latest = checkpoints.get("latest")
    reward = (
        f"{rewards[-1]:.3f} {trend(rewards)}  {sparkline(rewards)}"
        if rewards
        else "no rollouts yet"
    )
    rejected = validation.get("rejected", 0)
    by_reason = f" ({_counts(reasons)})" if reasons else ""
    amounts = ledger.get("amounts", {})
    return {
        "step": str(trainer_steps[-1]["step"])
        if trainer_steps
        else ("none yet" if latest is None else str(latest)),
        "task reward": reward,
        "nodes": f"{nodes.get('total', 0)}: {_counts(nodes.get('by_state', {}))}",
        "tasks": _counts(tasks),
        "rollouts": f"{validation.get('accepted', 0)} validated, {rejected} rejected{by_reason}",
        "broadcast": _broadcast(checkpoints),
        "ledger": f"{ledger.get('entries', 0)} entries; "
        + (", ".join(f"{kind} {amount:+,}" for kind, amount in amounts.items()) or "no amounts"),
    }


def _broadcast(checkpoints: dict[str, Any]) -> str:
    """How many nodes hold the latest checkpoint, counted in the same read as that step."""
    step = checkpoints.get("counted_at", checkpoints.get("latest"))
    if step is None:
        return "no checkpoint yet"
    text = (
        f"{checkpoints.get('at_latest', 0)} of {checkpoints.get('live_nodes', 0)} nodes "
        f"on checkpoint {step}"
    )
    if "within_one_step" in checkpoints:
        text += f" ({checkpoints['within_one_step']} within one step)"
    return text


def plain_line(snapshot: dict[str, Any]) -> str:
    """One line for a log: the swarm as the dashboard sees it."""
    fields = summary_fields(snapshot)
    fields.pop("task reward")
    return "swarm: " + "; ".join(f"{label} {text}" for label, text in fields.items())


class SwarmWatch:
    """Poll the dashboard's overview while the demo runs and show it (see the module)."""

    def __init__(
        self, dashboard_url: str, *, metrics: Path | None = None, out: TextIO | None = None
    ) -> None:
        self.url = dashboard_url.rstrip("/")
        self.metrics = metrics
        self.trainer_steps: list[dict[str, Any]] = []
        self.out = out or sys.stdout
        self.live = self.out.isatty()
        self.snapshot: dict[str, Any] | None = None
        self.error = ""
        self._last_step: int | None = None

    @contextlib.contextmanager
    def shown(self) -> Iterator[None]:
        """Show the live panel (on a terminal) while the block runs; print goes above it."""
        if not self.live:
            yield
            return
        from rich.console import Console
        from rich.live import Live

        console = Console(file=self.out)
        with Live(self._render(), console=console, refresh_per_second=4, transient=False) as live:
            self._live = live
            try:
                yield
            finally:
                live.update(self._render())

    async def run(self) -> None:
        """Poll until cancelled."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if self.metrics is not None:
                    from rollnet.reference.trainer.metrics import read_jsonl

                    self.trainer_steps = read_jsonl(self.metrics)
                try:
                    async with session.get(f"{self.url}/api/overview") as reply:
                        reply.raise_for_status()
                        self.update(await reply.json())
                except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                    self.error = f"dashboard not readable: {error}"
                await asyncio.sleep(POLL_SECONDS)

    def update(self, snapshot: dict[str, Any]) -> None:
        """Take a new overview snapshot and show it."""
        self.snapshot = snapshot
        self.error = ""
        if self.live:
            live = getattr(self, "_live", None)
            if live is not None:
                live.update(self._render())
            return
        latest = snapshot.get("checkpoints", {}).get("latest")
        if latest is not None and latest != self._last_step:
            self._last_step = latest
            print(plain_line(snapshot), file=self.out, flush=True)

    def _render(self) -> Any:
        from rich.panel import Panel
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        if self.snapshot is None:
            table.add_row("swarm", self.error or "waiting for the coordinator's overview ...")
        else:
            for label, text in summary_fields(self.snapshot, self.trainer_steps).items():
                table.add_row(label, text)
            if self.error:
                table.add_row("", self.error)
        table.add_row("dashboard", self.url)
        return Panel(table, title="rollnet demo", border_style="cyan")
