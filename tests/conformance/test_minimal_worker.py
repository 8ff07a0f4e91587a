"""examples/minimal_worker.py: a worker from the documents alone — nothing from rollnet.sdk or
rollnet.reference — reproduces the golden vectors and passes the worker suite."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from script_testing import load_file

from rollnet.reference.conformance.worker import (
    WORKER_CASES,
    WorkerHarnessConfig,
    run_worker_suite,
)
from rollnet.sdk.conformance import Outcome, format_result

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minimal_worker.py"
VECTORS = json.loads((ROOT / "protos" / "rollnet" / "v1" / "vectors.json").read_text())
#: What the example may import besides the standard library (the issue's list, with gRPC and
#: Google's error messages that carry the protocol, and `tokenizers`, which defines tokenization).
ALLOWED = {"blake3", "cryptography", "google", "grpc", "numpy", "tokenizers", "torch"}


@pytest.fixture(scope="module")
def worker() -> ModuleType:
    return load_file(EXAMPLE)


def test_imports_nothing_of_the_sdk_or_the_reference() -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(EXAMPLE.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    third_party = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    generated = {name for name in third_party if name == "rollnet.v1"}
    others = {name.split(".")[0] for name in third_party - generated}
    assert others <= ALLOWED, others - ALLOWED
    assert not [name for name in imported if name.startswith("rollnet.") and name != "rollnet.v1"]


def test_reproduces_the_golden_vectors(worker: ModuleType) -> None:
    for case in VECTORS["gumbel_noise"]["cases"]:
        noise = worker.gumbel(int(case["seed"]), case["position"], max(case["tokens"]) + 1)
        assert np.allclose(noise[case["tokens"]], case["gumbel"], rtol=0, atol=1e-12)
    toploc = VECTORS["toploc"]
    rounding = toploc["bf16_rounding"]
    floats = np.array([int(x, 16) for x in rounding["float32"]], dtype=np.uint32)
    assert [f"{b:04x}" for b in worker.bf16_bits(floats.view(np.float32))] == rounding["bf16"]

    def hidden(entry: dict[str, Any], rows: int) -> np.ndarray:
        bits = np.array([int(x, 16) for x in entry["bf16"]], dtype=np.uint32) << 16
        return bits.view(np.float32).reshape(rows, entry["hidden_size"])

    for window in toploc["windows"]:
        assert worker.window_proof(hidden(window, window["rows"])).hex() == window["proof"]
    rollout = toploc["rollout"]
    assert (
        worker.toploc_proof(hidden(rollout, rollout["completion_tokens"])).hex()
        == (rollout["proof"])
    )
    binding = VECTORS["binding"]
    seeds = binding["sampling_seeds"]
    for seed in seeds["seeds"]:
        derived = worker.sampling_seed(seeds["network_id"], seeds["task_id"], seed["rollout_index"])
        assert derived == int(seed["seed"])
    commitment = binding["commitment_digest"]
    tokens = worker.domain_digest(
        "rollnet/v1/rollout-tokens",
        worker._u32le(commitment["prompt_ids"]),
        worker._u32le(commitment["completion_ids"]),
    )
    digest = worker.domain_digest(
        "rollnet/v1/rollout-commitment",
        *commitment["lease"].values(),
        bytes.fromhex(commitment["blob_blake3"]),
        commitment["rollout_index"],
        int(commitment["sampling_seed"]),
        tokens,
        worker.domain_digest("rollnet/v1/toploc-proof", bytes.fromhex(commitment["proof"])),
    )
    assert digest.hex() == commitment["digest"]
    for case in VECTORS["arithmetic_prompts"]["cases"]:
        for problem in case["problems"]:
            assert worker.arithmetic_problem(
                case["normalized_config"], int(problem["prompt_id"])
            ) == (problem["prompt"], problem["answer"], problem["target_length"])


@pytest.mark.slow
async def test_passes_the_worker_suite(tmp_path: Path) -> None:
    command = (
        f"{{python}} {EXAMPLE} --coordinator {{target}} --key {{key}} --data-dir {{data_dir}} "
        "--network-id {network_id}"
    )
    report = await run_worker_suite(
        WorkerHarnessConfig(command=command, work_dir=tmp_path, work_timeout=60.0)
    )
    for result in report.results:
        print(format_result(result))
    print(report.summary())
    assert [r.name for r in report.results] == [c.name for c in WORKER_CASES]
    assert all(r.outcome is Outcome.PASSED for r in report.results), report.summary()
