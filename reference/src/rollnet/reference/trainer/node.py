"""The trainer as a node: demand, intake, optimizer steps, checkpoints, state — one loop.

:class:`Trainer` joins the coordinator with the trainer role through the SDK's
:class:`~rollnet.sdk.node.NodeSession` (registration, heartbeats, back-off, drain: the same as a
worker's and a validator's), then repeats:

1. **demand** — asks for what :meth:`RolloutIntake.demand_needed` says is missing
   (RequestRollouts with the environment, group size, sampling and prompts per task);
2. **intake** — a background task follows StreamRollouts from the saved cursor and feeds every
   accepted rollout to the :class:`~rollnet.reference.trainer.intake.RolloutIntake` (rewards
   the validator did not compute are recomputed through the environment's sandbox);
3. **step** — once a batch of groups with signal within the staleness bound is ready, one
   optimizer step (in a worker thread, so heartbeats and the stream keep flowing);
4. **commit** — the new weights are exported as a bf16 checkpoint, the master weights and
   optimizer state saved, ``state.json`` replaced (the commit point, see
   :mod:`~rollnet.reference.trainer.state`), the metrics line appended, then the checkpoint is
   published with a signed manifest and old ones pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.intake import Group, RolloutIntake
from rollnet.reference.trainer.metrics import TrainerMetrics, append_jsonl, read_jsonl
from rollnet.reference.trainer.publish import (
    checkpoint_dir,
    export_checkpoint,
    prune_checkpoints,
    publish_step,
)
from rollnet.reference.trainer.state import (
    TrainerState,
    commit,
    load_master,
    load_state,
    save_master,
)
from rollnet.sdk import Identity
from rollnet.sdk.client import TlsConfig
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.node import (
    DEFAULT_NETWORK_ID,
    NodeConfig,
    NodeFatalError,
    NodeSession,
    StopRequested,
    log_event,
)
from rollnet.sdk.retry import is_retryable
from rollnet.sdk.version import software_version
from rollnet.v1 import common_pb2, rollout_pb2, rollout_service_pb2

__all__ = ["Trainer", "TrainerFatalError", "TrainerSettings"]

log = logging.getLogger("rollnet.trainer")


class TrainerFatalError(Exception):
    """The trainer cannot go on: refused by the coordinator, or its state and the coordinator's
    checkpoints disagree."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TrainerSettings:
    """Where the trainer runs and what it trains."""

    target: str
    model_dir: Path
    data_dir: Path
    config: TrainerConfig
    network_id: str = DEFAULT_NETWORK_ID
    tls: TlsConfig | None = None
    reward_isolation: str = "auto"
    reward_time_limit_s: float = 10.0
    publish_deltas: bool = True
    """Also publish each checkpoint as a delta against the one before (docs/broadcast.md)."""
    origin_dir: Path | None = None
    """Write every checkpoint's blobs here too, for ``rollnet relay --origin DIR``."""


@dataclass
class _Rollouts:
    """Waiting for rollouts: woken by the stream."""

    arrived: asyncio.Event
    last_group_at: float


class Trainer:
    """The reference trainer node (see the module docs)."""

    def __init__(
        self, settings: TrainerSettings, identity: Identity, metrics: TrainerMetrics | None = None
    ) -> None:
        self.settings = settings
        self.config = settings.config
        self.identity = identity
        self.metrics = metrics or TrainerMetrics()
        self.session = NodeSession(
            NodeConfig(
                target=settings.target,
                role=common_pb2.ROLE_TRAINER,
                network_id=settings.network_id,
                tls=settings.tls,
                software_version=software_version("trainer"),
            ),
            identity,
        )
        self.step = 0
        self._recomputed: dict[int, tuple[float, float]] = {}
        self._wake = _Rollouts(asyncio.Event(), time.monotonic())
        self._stream_error: BaseException | None = None
        self._behaviour_models: dict[int, Any] = {}
        self._validated_fraction = self._recomputed_fraction = 0.0
        self._scored_before = (0, 0.0)
        self.intake: RolloutIntake | None = None

    def request_stop(self) -> None:
        """Finish the step in hand (it is committed), deregister and return from :meth:`run`."""
        self.session.request_stop()
        self._wake.arrived.set()

    async def run(self) -> None:
        """Train until ``max_steps`` or stopped. Raises :class:`TrainerFatalError` when refused
        for good or when the coordinator's checkpoints are ahead of this trainer's state."""
        if int(os.environ.get("RANK", "0")) != 0:
            # A torchrun follower: no node of its own, it takes part in rank 0's steps.
            await asyncio.to_thread(self._load)
            await asyncio.to_thread(self.learner.follow)
            return
        session = self.session
        try:
            if await session.start():
                await self._train()
                await session.deregister("trainer stopped")
        except (NodeFatalError, StopRequested):
            pass
        except RollnetError as error:
            # A refusal no retry fixes (an environment the coordinator does not serve, a
            # demand out of its bounds): say what was refused, as one line.
            raise TrainerFatalError(
                f"the coordinator refused: {error.reason or error.code.name}: {error.message}",
                error.reason,
            ) from error
        finally:
            await session.close()
            reward = getattr(self, "_sandbox", None)
            if reward is not None:
                await asyncio.to_thread(reward.close)
        if session.fatal is not None:
            raise TrainerFatalError(str(session.fatal), session.fatal.reason) from session.fatal

    # ------------------------------------------------------------------ setup

    def _load(self) -> TrainerState:
        """Model, optimizer, environment and committed state (in a worker thread)."""
        from rollnet.reference.envs import RewardSandbox, load_environment
        from rollnet.reference.inference.tokenization import CheckpointTokenizer
        from rollnet.reference.trainer.learner import Learner

        config = self.config
        settings = self.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        state = load_state(settings.data_dir) or TrainerState()
        master = load_master(settings.data_dir, state.step) if state.step > 0 else None
        self.learner = Learner(config, settings.model_dir, master, state.step)
        self.model = self.learner.model
        if not self.learner.leads:
            return state
        self.tokenizer = CheckpointTokenizer.load(settings.model_dir)
        self.environment = load_environment(config.environment, config.environment_config)
        self._sandbox = RewardSandbox(
            time_limit_s=settings.reward_time_limit_s,
            isolation=settings.reward_isolation,  # type: ignore[arg-type]
            readable=self.environment.sandbox_paths,
        )
        return state

    async def _ensure_published(self, step: int) -> None:
        """Publish checkpoint ``step`` unless the coordinator has it; refuse to go on when the
        coordinator is ahead (another trainer, or this one's state was lost)."""
        client = self.session.client
        latest = await self.session.call(
            "get_latest_checkpoint", lambda: client.checkpoints.get_latest_checkpoint()
        )
        have = latest.checkpoint.step if latest.HasField("checkpoint") else None
        if have is not None and have > step:
            raise TrainerFatalError(
                f"the coordinator already has checkpoint {have}, this trainer's state is at step "
                f"{step} ({self.settings.data_dir / 'state.json'}): resume from the data "
                "directory that produced it, or start a new network"
            )
        if have == step:
            return
        directory = checkpoint_dir(self.settings.data_dir, step)
        if not (directory / "config.json").exists():
            weights, _ = await asyncio.to_thread(self.learner.full_state)
            await asyncio.to_thread(
                export_checkpoint, self.model, weights, self.settings.model_dir, directory
            )
        published = await self.session.call(
            "publish_checkpoint",
            lambda: publish_step(
                client,
                self.identity,
                self.settings.data_dir,
                step,
                self.settings.network_id,
                published=have,
                deltas=self.settings.publish_deltas,
                origin_dir=self.settings.origin_dir,
                # One step more than the trainer keeps: nodes may still be fetching it.
                origin_keep=self.config.keep_checkpoints + 1,
            ),
        )
        deltas = [f for f in published.manifest.files if f.HasField("delta")]
        log_event(
            log,
            logging.INFO,
            "checkpoint_published",
            {
                "step": step,
                "bytes": published.bytes_uploaded,
                "delta_files": len(deltas),
                "delta_bytes": sum(f.delta.content.size for f in deltas),
            },
        )

    # ------------------------------------------------------------------ the stream

    def _reward_of(self, rollout: rollout_pb2.AcceptedRollout) -> tuple[float, float]:
        if rollout.HasField("validated_reward"):
            reward = rollout.validated_reward
            return reward.total, reward.task_reward
        return self._recomputed[rollout.sequence]

    def _recompute(self, rollout: rollout_pb2.AcceptedRollout) -> tuple[float, float]:
        """The reward of a rollout accepted without a spot check: the trainer never takes a
        worker's claimed reward, it scores the completion itself."""
        problem = self.environment.prompt(rollout.rollout.prompt_id)
        completion = list(rollout.rollout.completion_token_ids)
        text = self.tokenizer.decode(completion, skip_special_tokens=True)
        [result] = self._sandbox.rewards(self.environment, [(problem, text, len(completion))])
        return result.reward.total, result.reward.task_reward

    async def _follow_stream(self, intake: RolloutIntake, after: int, min_step: int) -> None:
        client = self.session.client
        failures = 0
        while not self.session.stopping:
            try:
                stream = client.rollouts.stream(after, min_checkpoint_step=min_step, timeout=None)
                async for rollout in stream:
                    failures = 0
                    after = max(after, rollout.sequence)
                    if not rollout.HasField("validated_reward") and not intake.settled(
                        rollout.sequence
                    ):
                        self._recomputed[rollout.sequence] = await asyncio.to_thread(
                            self._recompute, rollout
                        )
                    before = intake.counters.groups_complete
                    intake.offer(rollout, self.step)
                    if intake.counters.groups_complete != before:
                        self._wake.last_group_at = time.monotonic()
                        self._wake.arrived.set()
            except RollnetError as error:
                if error.code.name in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
                    self._stream_error = error
                    self._wake.arrived.set()
                    return
                if not is_retryable(error):
                    self._stream_error = error
                    self._wake.arrived.set()
                    return
            failures += 1
            if await self.session.sleep(self.session.backoff(failures)):
                return

    def _stream_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._stream_error is None:
            self._stream_error = task.exception()
            self._wake.arrived.set()

    # ------------------------------------------------------------------ the loop

    async def _demand(self, intake: RolloutIntake) -> None:
        wanted = intake.demand_needed(self.step)
        if wanted <= 0:
            return
        config = self.config
        client = self.session.client
        request = rollout_service_pb2.RequestRolloutsRequest(
            request_id=uuid.uuid4().hex,
            rollout_step=self.step + 1,
            environment=config.environment,
            prompt_count=wanted,
            samples_per_prompt=config.group_size,
            sampling=common_pb2.SamplingParams(
                temperature=config.temperature, max_new_tokens=config.max_new_tokens
            ),
            prompts_per_task=config.prompts_per_task,
        )
        request.environment_config.update(config.environment_config)
        response = await self.session.call(
            "request_rollouts", lambda: client.rollouts.request_rollouts(request)
        )
        intake.record_demand(response.checkpoint_step, wanted)

    async def _next_batch(self, intake: RolloutIntake) -> list[Group] | None:
        while True:
            if self._stream_error is not None:
                raise self._stream_error
            batch = intake.take_batch(self.step)
            if batch is not None:
                return batch
            if self.session.stopping:
                return None
            await self._demand(intake)
            self._wake.arrived.clear()
            quiet = time.monotonic() - self._wake.last_group_at
            timeout = max(0.1, self.config.demand_timeout - quiet)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.arrived.wait(), timeout)
            if time.monotonic() - self._wake.last_group_at >= self.config.demand_timeout:
                lost = intake.write_off_demand()
                self._wake.last_group_at = time.monotonic()
                log_event(log, logging.WARNING, "demand_written_off", {"groups": lost})

    async def _train(self) -> None:
        settings = self.settings
        config = self.config
        state = await asyncio.to_thread(self._load)
        self.step = state.step
        self._restore_metrics_line(state)
        await self._ensure_published(self.step)
        intake = RolloutIntake(
            group_size=config.group_size,
            batch_groups=config.batch_groups,
            max_off_policy_steps=config.max_off_policy_steps,
            reward_of=self._reward_of,
            normalize_std=config.normalize_advantage_std,
            state=state.intake,
        )
        self.intake = intake
        min_step = max(0, self.step - config.max_off_policy_steps)
        follower = asyncio.create_task(self._follow_stream(intake, intake.after_sequence, min_step))
        self.metrics.step.set(self.step)
        try:
            while not self.session.stopping and (
                config.max_steps == 0 or self.step < config.max_steps
            ):
                await self._demand(intake)
                waited_from = time.monotonic()
                batch = await self._next_batch(intake)
                if batch is None:
                    break
                idle = time.monotonic() - waited_from
                lags = Counter(str(self.step - group.checkpoint_step) for group in batch)
                stats, busy = await asyncio.to_thread(self._optimize, batch)
                self.step += 1
                line = self._metrics_line(batch, stats, idle, busy, dict(lags), intake)
                await asyncio.to_thread(self._commit, intake, line)
                await self._ensure_published(self.step)
                await asyncio.to_thread(
                    prune_checkpoints, settings.data_dir, self.step, config.keep_checkpoints
                )
                self._recomputed = {
                    s: r for s, r in self._recomputed.items() if not intake.settled(s)
                }
                log_event(
                    log,
                    logging.INFO,
                    "trainer_step",
                    {
                        "step": self.step,
                        "reward": round(line["reward"], 4),
                        "task_reward": round(line["task_reward"], 4),
                        "loss": round(line["loss"], 5),
                        "grad_norm": round(line["grad_norm"], 4),
                        "idle_fraction": round(line["idle_fraction"], 3),
                    },
                )
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower
            await asyncio.to_thread(self.learner.stop)

    def _optimize(self, batch: list[Group]) -> tuple[Any, float]:
        from rollnet.reference.trainer.policy import TrainingSequence

        started = time.monotonic()
        config = self.config
        sequences: list[TrainingSequence] = []
        unchecked: dict[int, list[int]] = {}  # checkpoint step -> indexes without validator μ
        for group in batch:
            for accepted, advantage in zip(group.rollouts, group.advantages, strict=True):
                rollout = accepted.rollout
                completion = list(rollout.completion_token_ids)
                validated = list(accepted.validated_logprobs)
                checked = len(validated) == len(completion)
                if not checked:
                    unchecked.setdefault(group.checkpoint_step, []).append(len(sequences))
                sequences.append(
                    TrainingSequence(
                        prompt_ids=list(rollout.prompt_token_ids),
                        completion_ids=completion,
                        behaviour_logprobs=list(rollout.behaviour_logprobs),
                        validated_logprobs=validated if checked else None,
                        advantage=advantage,
                        temperature=config.temperature,
                    )
                )
        total = sum(len(s.completion_ids) for s in sequences)
        self._validated_fraction = (
            sum(len(s.completion_ids) for s in sequences if s.validated_logprobs is not None)
            / total
        )
        recomputed = 0
        for checkpoint, indexes in unchecked.items():
            values = self._recompute_behaviour(checkpoint, [sequences[i] for i in indexes])
            if values is None:
                continue
            for index, logprobs in zip(indexes, values, strict=True):
                sequences[index] = dataclasses.replace(
                    sequences[index], validated_logprobs=logprobs
                )
                recomputed += len(logprobs)
        self._recomputed_fraction = recomputed / total
        stats = self.learner.step(sequences)
        return stats, time.monotonic() - started

    def _recompute_behaviour(
        self, checkpoint: int, sequences: list[Any]
    ) -> list[list[float]] | None:
        """``μ`` of rollouts no validator re-checked, computed here with the very checkpoint
        they claim (the bf16 weights this trainer published, kept on disk while a rollout may
        still come from them); ``None`` when that checkpoint is gone (then the loss falls back
        to the on-policy weight)."""
        from transformers import AutoModelForCausalLM

        from rollnet.reference.trainer.policy import PolicyForward, behaviour_logprobs

        directory = checkpoint_dir(self.settings.data_dir, checkpoint)
        if not (directory / "config.json").exists():
            return None
        cached = self._behaviour_models.get(checkpoint)
        if cached is None:
            loader: Any = AutoModelForCausalLM
            model = loader.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
            cached = PolicyForward(model.to(self.config.device).eval())
            oldest = self.step - self.config.max_off_policy_steps
            self._behaviour_models = {
                k: v for k, v in self._behaviour_models.items() if k >= oldest
            }
            self._behaviour_models[checkpoint] = cached
        return behaviour_logprobs(
            cached,
            sequences,
            self.learner.pad_id,
            torch.device(self.config.device),
            self.config.micro_batch_size,
        )

    def _metrics_line(
        self,
        batch: list[Group],
        stats: Any,
        idle: float,
        busy: float,
        staleness: dict[str, int],
        intake: RolloutIntake,
    ) -> dict[str, Any]:
        rewards = [r for g in batch for r in g.rewards]
        tasks = [r for g in batch for r in g.task_rewards]
        advantages = [a for g in batch for a in g.advantages]
        tokens = max(stats.loss_tokens, 1)
        samples = len(rewards)
        wall = max(idle + busy, 1e-9)
        scored = intake.counters.scored_rollouts - self._scored_before[0]
        scored_sum = intake.counters.scored_task_reward - self._scored_before[1]
        self._scored_before = (intake.counters.scored_rollouts, intake.counters.scored_task_reward)
        line: dict[str, Any] = {
            "step": self.step,
            # Everything scored since the last step, groups without signal included: what the
            # policy's samples are worth (the batch's own mean leaves out the groups that were
            # all right, or all wrong).
            "sampled_task_reward": scored_sum / scored if scored else statistics.fmean(tasks),
            "sampled_rollouts": scored,
            "reward": statistics.fmean(rewards),
            "task_reward": statistics.fmean(tasks),
            "length_penalty": statistics.fmean(t - r for t, r in zip(tasks, rewards, strict=True)),
            "advantage_mean": statistics.fmean(advantages),
            "advantage_std": statistics.pstdev(advantages),
            "advantage_abs_max": max(abs(a) for a in advantages),
            "loss": stats.loss,
            "loss_tokens": stats.loss_tokens,
            "mismatch_kl": stats.mismatch_kl / tokens,
            "entropy": stats.entropy / tokens,
            "kl_reference": stats.kl_reference / tokens,
            "grad_norm": stats.grad_norm,
            "learning_rate": stats.learning_rate,
            "validated_fraction": self._validated_fraction,
            "recomputed_fraction": self._recomputed_fraction,
            "groups": len(batch),
            "samples": samples,
            "staleness": staleness,
            "dropped_stale": intake.counters.dropped_stale,
            "dropped_no_signal": intake.counters.dropped_no_signal,
            "idle_seconds": idle,
            "busy_seconds": busy,
            "idle_fraction": idle / wall,
            "samples_per_s": samples / wall,
            "tokens_per_s": stats.loss_tokens / wall,
            "sequences": sorted(s for g in batch for s in g.sequences),
        }
        for name, count in stats.branch_counts.items():
            line[f"frac_{name}"] = count / tokens
        return line

    def _commit(self, intake: RolloutIntake, line: dict[str, Any]) -> None:
        data_dir = self.settings.data_dir
        weights, optimizer = self.learner.full_state()
        export_checkpoint(
            self.model, weights, self.settings.model_dir, checkpoint_dir(data_dir, self.step)
        )
        save_master(data_dir, self.step, weights, optimizer)
        commit(data_dir, TrainerState(step=self.step, intake=intake.state(), last_metrics=line))
        append_jsonl(data_dir / "metrics.jsonl", line)
        self.metrics.record(line)
        self.metrics.count_groups("trained", line["groups"])

    def _restore_metrics_line(self, state: TrainerState) -> None:
        """A crash between the commit and the metrics line loses the line: write it again."""
        if state.last_metrics is None:
            return
        path = self.settings.data_dir / "metrics.jsonl"
        steps = {line.get("step") for line in read_jsonl(path)}
        if state.step not in steps:
            append_jsonl(path, state.last_metrics)
