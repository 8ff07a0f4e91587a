"""``InferenceGenerator``: a leased task in, verifiable rollouts with claimed rewards out.

For each task it makes sure the required checkpoint is on disk and verified (fetched from the
coordinator's blob service and checked against the trainer-signed manifest by
:class:`rollnet.sdk.checkpoints.CheckpointStore`), reloads the backend when the step changed,
rebuilds each assigned prompt from the task's environment, samples every completion with its
lease-derived Gumbel seed while the backend builds TOPLOC proofs, and scores each completion with
the environment's verifier. The rewards are claims: validators recompute them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from google.protobuf import json_format

from rollnet.reference.envs import (
    DEFAULT_TIME_LIMIT_S,
    Environment,
    IsolationMode,
    Problem,
    RewardBreakdown,
    RewardSandbox,
    load_environment,
)
from rollnet.reference.inference.base import DType, Generation, InferenceBackend, SamplingParams
from rollnet.reference.inference.math_mode import math_mode_problems, refuse_message
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.sdk.checkpoints import BlobServiceShards, CheckpointStore, CheckpointVerificationError
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.prompts import encode_problem
from rollnet.sdk.worker import LeaseContext, LeaseLost, RolloutGenerator
from rollnet.v1 import (
    checkpoint_service_pb2,
    common_pb2,
    node_service_pb2,
    rollout_pb2,
    task_pb2,
    task_service_pb2,
)

log = logging.getLogger("rollnet.worker.generator")

BACKENDS = ("torch", "vllm")
"""Names ``make_backend`` accepts."""

_FINISH = {"eos": rollout_pb2.FINISH_REASON_EOS, "length": rollout_pb2.FINISH_REASON_LENGTH}


def make_backend(name: str) -> InferenceBackend:
    """A fresh, unloaded backend by name (``torch`` or ``vllm``)."""
    if name == "torch":
        from rollnet.reference.inference.torch_backend import TorchBackend

        return TorchBackend()
    if name == "vllm":
        from rollnet.reference.inference.vllm_backend import VllmBackend

        return VllmBackend()
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


class InferenceGenerator(RolloutGenerator):
    """Generates a task's rollouts with a local inference backend.

    ``backend_factory`` makes an unloaded backend; it is loaded from each checkpoint directory
    the tasks need. ``checkpoints`` keeps verified checkpoint directories (``async_level + 1`` of
    them). ``batch_size`` bounds the completions decoded in one backend call.
    """

    def __init__(
        self,
        backend_factory: Callable[[], InferenceBackend],
        checkpoints: CheckpointStore,
        *,
        device: str = "cpu",
        dtype: DType = "float32",
        batch_size: int = 64,
        reward_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
        reward_isolation: IsolationMode = "auto",
    ) -> None:
        self._factory = backend_factory
        self.checkpoints = checkpoints
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size
        self._backend: InferenceBackend | None = None
        self._tokenizer: CheckpointTokenizer | None = None
        self._loaded_step = 0
        # One generation at a time on the backend, even if an abandoned one is still unwinding.
        self._backend_lock = threading.Lock()
        self._environments: dict[tuple[str, str], Environment] = {}
        # Rewards are scored in a child process, on its main thread, under a hard time limit:
        # the environment's own limit (math-verify's SIGALRM) cannot work on this thread.
        self.rewards = RewardSandbox(time_limit_s=reward_time_limit_s, isolation=reward_isolation)

    @property
    def checkpoint_step(self) -> int:
        """The checkpoint step the backend holds (0 before the first task)."""
        return self._loaded_step

    def take_relay_reports(self, limit: int) -> Sequence[node_service_pb2.RelayReport]:
        """Relays the checkpoint store caught serving wrong bytes, for the next heartbeat."""
        return self.checkpoints.take_relay_reports(limit)

    async def prefetch_checkpoint(self, step: int, client: RollnetClient) -> None:
        """Download and verify ``step`` ahead of the tasks that will need it."""
        await self._checkpoint_dir(step, client)
        log.info("checkpoint_prefetched", extra={"step": step})

    async def _checkpoint_dir(self, step: int, client: RollnetClient) -> Path:
        stored = self.checkpoints.path(step)
        if stored is not None:
            return stored
        response = await client.checkpoints.get_checkpoint(
            checkpoint_service_pb2.GetCheckpointRequest(step=step)
        )
        return await self.checkpoints.ensure(response.checkpoint, BlobServiceShards(client))

    def _load(self, step: int, directory: Path) -> None:
        with self._backend_lock:
            if self._loaded_step == step and self._backend is not None:
                return
            # Drop the previous checkpoint's backend before loading the next: an engine that
            # reserves most of the GPU (vLLM) cannot have two copies loaded at once. A failed
            # load leaves none, and the next task loads again.
            self._backend = None
            self._loaded_step = 0
            gc.collect()
            backend = self._factory()
            backend.load(str(directory), device=self.device, dtype=self.dtype)
            self._tokenizer = CheckpointTokenizer.load(directory)
            self._backend = backend
            self._loaded_step = step
        log.info("checkpoint_loaded", extra={"step": step})

    def _environment(self, task: task_pb2.Task) -> Environment:
        """The task's environment, checked to be scorable here before any generation (a
        version or digest that differs, or code that needs a sandbox this host lacks, is
        refused with the reason: the task goes back to the coordinator)."""
        config = json_format.MessageToDict(task.environment_config)
        key = (task.environment, json_format.MessageToJson(task.environment_config, indent=0))
        if key not in self._environments:
            environment = load_environment(task.environment, config)
            self.rewards.check(environment)
            self._environments[key] = environment
        return self._environments[key]

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        """Fetch and load the checkpoint, then sample, prove and score every completion."""
        try:
            wanted = lease.compute_dtype
        except ValueError as error:
            wanted = str(error)
        if wanted != self.dtype:
            # Refused before any work: validators prefill in the task's dtype, and a rollout
            # made in another fails their thresholds after all the generation was paid for.
            lease.cancel(
                f"task {task.task_id} is to be generated in {wanted}; this worker runs "
                f"{self.dtype} (--dtype)",
                give_back=task_service_pb2.FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED,
            )
            raise LeaseLost(lease.cancel_reason)
        problems = math_mode_problems(self.dtype, self.device)
        if problems:
            # Checked per task, not only at start: code in this process (a library, the
            # caller) may change the math mode after the worker started.
            lease.cancel(
                refuse_message(self.dtype, problems),
                give_back=task_service_pb2.FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED,
            )
            raise LeaseLost(lease.cancel_reason)
        try:
            directory = await self._checkpoint_dir(task.checkpoint_step, lease.client)
        except (RollnetError, CheckpointVerificationError) as error:
            lease.cancel(
                f"checkpoint {task.checkpoint_step} unavailable: {error}",
                give_back=task_service_pb2.FAIL_REASON_CHECKPOINT_UNAVAILABLE,
            )
            raise LeaseLost(lease.cancel_reason) from error
        if self._loaded_step != task.checkpoint_step or self._backend is None:
            await asyncio.to_thread(self._load, task.checkpoint_step, directory)
        # Building it may list a taskset in a sandboxed child: not on the event loop.
        environment = await asyncio.to_thread(self._environment, task)
        return await asyncio.to_thread(self._generate_blocking, task, lease, environment)

    def _generate_blocking(
        self, task: task_pb2.Task, lease: LeaseContext, environment: Environment
    ) -> list[rollout_pb2.Rollout]:
        samples = task.samples_per_prompt
        problems = [environment.prompt(int(pid)) for pid in task.prompt_ids]
        with self._backend_lock:
            backend, tokenizer = self._backend, self._tokenizer
            assert backend is not None
            assert tokenizer is not None
            prompts = [encode_problem(tokenizer, problem) for problem in problems]
            slots = [(p, s) for p in range(len(problems)) for s in range(samples)]
            rollouts: list[rollout_pb2.Rollout] = []
            for start in range(0, len(slots), self.batch_size):
                lease.raise_if_cancelled()
                chunk = slots[start : start + self.batch_size]
                sampling = SamplingParams(
                    temperature=task.sampling.temperature,
                    max_new_tokens=task.sampling.max_new_tokens,
                    seeds=[lease.sampling_seed(start + i) for i in range(len(chunk))],
                )
                generations = backend.generate([prompts[p] for p, _ in chunk], sampling)
                rewards = self._score(environment, [problems[p] for p, _ in chunk], generations)
                for (p, s), generation, reward in zip(chunk, generations, rewards, strict=True):
                    rollouts.append(self._rollout(task, p, s, problems[p], generation, reward))
                lease.report_progress(len(rollouts))
        return rollouts

    def _score(
        self,
        environment: Environment,
        problems: Sequence[Problem],
        generations: Sequence[Generation],
    ) -> list[RewardBreakdown]:
        """Each completion's reward, from the environment's verifier in the reward sandbox."""
        tokenizer = self._tokenizer
        assert tokenizer is not None
        items = [
            (
                problem,
                tokenizer.decode(generation.completion_ids, skip_special_tokens=True),
                len(generation.completion_ids),
            )
            for problem, generation in zip(problems, generations, strict=True)
        ]
        results = self.rewards.rewards(environment, items)
        for problem, result in zip(problems, results, strict=True):
            if result.failure is not None:
                log.warning(
                    "reward_unverifiable",
                    extra={"prompt_id": problem.prompt_id, "failure": result.failure},
                )
        return [result.reward for result in results]

    def close(self) -> None:
        """Stop the reward sandbox's child process."""
        self.rewards.close()

    def _rollout(
        self,
        task: task_pb2.Task,
        prompt_index: int,
        sample_index: int,
        problem: Problem,
        generation: Generation,
        reward: RewardBreakdown,
    ) -> rollout_pb2.Rollout:
        assert generation.seed is not None
        return rollout_pb2.Rollout(
            prompt_index=prompt_index,
            prompt_id=task.prompt_ids[prompt_index],
            sample_index=sample_index,
            prompt_token_ids=generation.prompt_ids,
            completion_token_ids=generation.completion_ids,
            behaviour_logprobs=generation.logprobs,
            sampling_seed=generation.seed,
            target_length=problem.target_length or 0,
            finish_reason=_FINISH[generation.finish_reason],
            toploc_proof=generation.proof,
            claimed_reward=common_pb2.Reward(
                task_reward=reward.task_reward,
                length_penalty=reward.length_penalty,
                total=reward.total,
            ),
        )
