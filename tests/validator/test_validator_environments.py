"""End to end with the environments whose code is untrusted: a real coordinator, worker and
validator (in process, on loopback) on the tiny model, for the ``code`` environment and for a
verifiers taskset, its prompts as plain text and as chat messages (through a chat template the
test gives the tiny checkpoint).

The tiny model writes noise, so the rewards are mostly 0: what is checked is that the pipeline
runs through the sandboxes on both sides (the worker's claims are recomputed by the validator
the same way and match), that every commitment is accepted and credited, and that the
validated rewards are the environment's own.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2
from swarm_testing import Ledger
from validator_testing import coordinator_config_for, start_trainer

from rollnet.ledger.enums import TaskState
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.testing import in_process_validator, in_process_worker
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import wait_until
from rollnet.v1 import common_pb2, rollout_service_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
import vf_tasksets

pytestmark = pytest.mark.usefixtures("sandbox_host")

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # The whole completion is the program, so the tiny model's text runs in the sandbox.
    "code": ("code", {"program": "completion", "test_timeout_s": 5}),
    "verifiers": ("verifiers", {"taskset": vf_tasksets.TASKSET, "prompt_format": "text"}),
    "verifiers-chat": ("verifiers", {"taskset": vf_tasksets.TASKSET, "prompt_format": "chat"}),
}

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token + m['role'] + '\\n' + m['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}"
)
# The probe taskset's one user message as plain text, and what the template makes of it.
TEXT_PROMPT = re.compile(r"Reverse the word [a-z]+[0-9]+\.")
CHAT_PROMPT = re.compile(
    r"<\|bos\|>user\nReverse the word [a-z]+[0-9]+\.<\|endoftext\|>\n<\|bos\|>assistant\n"
)


@pytest.fixture
def chat_model(tiny_model: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint with a chat template in its tokenizer_config.json (published with
    it, so worker and validator read it from the checkpoint they downloaded)."""
    directory = shutil.copytree(tiny_model, tmp_path / "chat-model")
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_pipeline_runs_validates_and_credits(
    case: str,
    tmp_path: Path,
    sqlite_url: str,
    tiny_model: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environment, environment_config = CASES[case]
    chat = environment_config.get("prompt_format") == "chat"
    model = request.getfixturevalue("chat_model") if chat else tiny_model
    if environment == "verifiers":
        pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed")
        monkeypatch.syspath_prepend(str(vf_tasksets.install(tmp_path / "site")))
    from datetime import timedelta

    trainer, validator_identity = Identity.generate(), Identity.generate()
    config = coordinator_config_for(
        tmp_path,
        sqlite_url,
        trainer,
        validator_identity,
        lease_duration=timedelta(seconds=60),
        environments=frozenset({environment}),
    )
    coordinator = await start_coordinator(config)
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(coordinator.address, trainer, model)
    worker, generator = in_process_worker(coordinator.address, tmp_path / "worker")
    validator = in_process_validator(
        coordinator.address, tmp_path / "validator", validator_identity
    )
    running = [asyncio.create_task(worker.run()), asyncio.create_task(validator.run())]
    try:
        struct = struct_pb2.Struct()
        struct.update(environment_config)
        response = await trainer_client.rollouts.request_rollouts(
            rollout_service_pb2.RequestRolloutsRequest(
                rollout_step=1,
                environment=environment,
                environment_config=struct,
                prompt_count=4,
                samples_per_prompt=2,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=24),
                prompts_per_task=2,
            ),
            # The first demand for a verifiers configuration lists the taskset in a sandboxed
            # child (importing verifiers takes seconds of CPU).
            timeout=300,
        )
        assert len(response.task_ids) == 2
        await wait_until(
            lambda: ledger.tasks_in(TaskState.ACCEPTED) == 2,
            within=400,
            what="both tasks accepted",
        )
        verdicts = ledger.verdicts_by_node()[worker.node_id]
        assert len(verdicts) == 2
        for accepted, reasons, figures in verdicts:
            assert accepted
            assert not reasons
            rewards = [c for c in figures["checks"] if c["check"] == "reward"]
            assert len(rewards) == 4
            assert all(c["passed"] for c in rewards)
        assert ledger.balance(worker.node_id, "credit") > 0
        if environment == "verifiers":
            # The prompt ids the validator found equal to its own: the template's rendering,
            # encoded by tokenizer.json (its special tokens as tokens), or the plain text.
            tokenizer = CheckpointTokenizer.load(model)
            stream = trainer_client.rollouts.stream(0)
            for _ in range(8):
                rollout = (await asyncio.wait_for(anext(stream), timeout=30)).rollout
                ids = list(rollout.prompt_token_ids)
                text = tokenizer.decode(ids, skip_special_tokens=False)
                assert tokenizer.encode(text) == ids
                assert (CHAT_PROMPT if chat else TEXT_PROMPT).fullmatch(text), text
        # The environment was scored in its sandboxes: the worker's reward child is isolated
        # (verifiers) or absent (code: every test has a sandbox of its own).
        sandbox = generator.rewards
        if environment == "verifiers":
            assert sandbox.isolated
            assert sandbox.child_pid is not None
        else:
            assert sandbox.child_pid is None
    finally:
        worker.request_stop()
        validator.request_stop()
        await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 60)
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=1)
        ledger.close()
