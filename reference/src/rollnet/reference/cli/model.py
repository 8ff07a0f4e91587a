"""``rollnet model``: make local models (``init-tiny``, ``warm-start``) and score problems with
one (``difficulty``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rollnet.reference.cli import node_options
from rollnet.reference.cli.option_types import directory, whole

_hidden = whole("hidden size", minimum=8, maximum=8192)


def _hidden_size(text: str) -> int:
    # Four attention heads whose dimension is even (rotary embeddings pair dimensions).
    value = _hidden(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"{value}: the hidden size must be a multiple of 8")
    return value


def _init_tiny(args: argparse.Namespace) -> int:
    started = time.monotonic()
    # Progress on stderr: importing torch and transformers alone takes seconds on a small machine.
    print(f"creating a tiny model in {args.out}: loading PyTorch ...", file=sys.stderr, flush=True)
    # Imported here so that other commands do not pay for importing torch and transformers.
    from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model

    spec = TinyModelSpec(hidden_size=args.hidden_size, num_hidden_layers=args.layers)
    print("drawing weights and writing files ...", file=sys.stderr, flush=True)
    path = init_tiny_model(args.out, seed=args.seed, spec=spec)
    print(f"wrote tiny model (seed {args.seed}) to {path} in {time.monotonic() - started:.1f} s")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``model`` command group."""
    parser = subparsers.add_parser("model", help="make local models for tests and the demo")
    commands = parser.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    init = commands.add_parser(
        "init-tiny",
        help="write a tiny Qwen2 model and character tokenizer (Hugging Face layout)",
        description=(
            "Write a tiny Qwen2-architecture model with random weights and a character "
            "tokenizer, offline (nothing is downloaded). Publish it with 'rollnet checkpoint "
            "publish --model DIR --step 0'."
        ),
    )
    init.add_argument(
        "--out", required=True, type=directory, help="output directory (created if missing)"
    )
    init.add_argument(
        "--seed", type=whole("seed", minimum=0), default=0, help="weight seed (default 0)"
    )
    init.add_argument(
        "--hidden-size",
        type=_hidden_size,
        default=64,
        help="hidden size, a multiple of 8 (default 64)",
    )
    init.add_argument(
        "--layers",
        type=whole("layers", minimum=1, maximum=64),
        default=2,
        help="transformer layers (default 2)",
    )
    init.set_defaults(handler=_init_tiny)
    _register_warm_start(commands)
    _register_difficulty(commands)


def _json_object(text: str) -> dict[str, Any]:
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, as {"min_length": 3}')
    return data


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text}: must be within [0, 1]")
    return value


def _band(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: give LOW:HIGH, as 0.1:0.9")
    band = (_fraction(low), _fraction(high))
    if band[0] > band[1]:
        raise argparse.ArgumentTypeError(f"{text}: LOW is above HIGH")
    return band


def _model_dir(text: str) -> Path:
    from rollnet.reference.checkpoint_publishing import CheckpointDirError, model_files

    path = Path(text)
    try:
        model_files(path)
    except CheckpointDirError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return path


def _environment_or_error(name: str, config: dict[str, Any]) -> None:
    from rollnet.reference.cli.errors import CliError
    from rollnet.reference.envs import (
        EnvironmentConfigError,
        EnvironmentRegistryError,
        UnknownEnvironmentError,
        load_environment,
    )

    try:
        load_environment(name, config)
    except (UnknownEnvironmentError, EnvironmentConfigError, EnvironmentRegistryError) as error:
        raise CliError(f"--environment {error}") from None


def _warm_start(args: argparse.Namespace) -> int:
    _environment_or_error(args.environment, args.environment_config)
    node_options.apply(args)
    started = time.monotonic()
    print("warm start: loading PyTorch ...", file=sys.stderr, flush=True)
    from rollnet.reference.trainer.warm_start import warm_start

    def progress(step: int, loss: float) -> None:
        if (step + 1) % 50 == 0:
            print(f"  step {step + 1}/{args.steps}: loss {loss:.3f}", file=sys.stderr, flush=True)

    result = warm_start(
        args.model,
        args.out,
        args.environment,
        args.environment_config,
        fmt=args.format,
        answer_share=args.answer_share,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        progress=progress,
    )
    print(
        f"warm-started {args.model} on {args.environment} ({args.format}, answer share "
        f"{args.answer_share:g}): loss {result.first_loss:.3f} -> {result.final_loss:.3f} in "
        f"{result.steps} steps, {time.monotonic() - started:.1f} s; wrote {result.out_dir}"
    )
    return 0


def _difficulty(args: argparse.Namespace) -> int:
    _environment_or_error(args.environment, args.environment_config)
    node_options.apply(args)
    print("difficulty: loading PyTorch ...", file=sys.stderr, flush=True)
    from rollnet.reference.trainer.difficulty import score_problems, write_band

    def progress(done: int, total: int) -> None:
        if done % 16 == 0 or done == total:
            print(f"  scored {done}/{total}", file=sys.stderr, flush=True)

    scored = score_problems(
        args.model,
        args.environment,
        args.environment_config,
        problems=args.problems,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        progress=progress,
    )
    low, high = args.keep
    kept = write_band(scored, low, high, args.out)
    easy = sum(1 for s in scored if s.mean_reward > high)
    hard = sum(1 for s in scored if s.mean_reward < low)
    print(
        f"kept {kept} of {len(scored)} problems with mean reward in [{low:g}, {high:g}] "
        f"({easy} too easy, {hard} too hard); wrote {args.out}"
    )
    return 0


def _register_warm_start(commands: Any) -> None:
    from rollnet.reference.trainer.warm_start import WARM_START_FORMATS

    parser = commands.add_parser(
        "warm-start",
        help="a short supervised start on an environment's answer format (seconds)",
        description=(
            "Train a model briefly on an environment's prompts followed by the format's target "
            "and EOS, so that RL has groups with signal from its first step. 'copy' (reverse: "
            "the string itself) teaches the shape of an answer, not the task; --answer-share "
            "mixes in that share of reference answers. Deterministic for a seed."
        ),
    )
    parser.add_argument("--model", required=True, type=_model_dir, help="starting model dir")
    parser.add_argument("--out", required=True, type=directory, help="output model dir")
    parser.add_argument("--environment", default="reverse", help="environment (default reverse)")
    parser.add_argument(
        "--environment-config", type=_json_object, default={}, metavar="JSON", help="as JSON"
    )
    parser.add_argument(
        "--format", choices=WARM_START_FORMATS, default="copy", help="target (default copy)"
    )
    parser.add_argument(
        "--answer-share",
        type=_fraction,
        default=0.1,
        help="share of examples showing the reference answer (default 0.1)",
    )
    parser.add_argument("--steps", type=whole("steps"), default=400, help="default 400")
    parser.add_argument("--batch-size", type=whole("examples"), default=32, help="default 32")
    parser.add_argument(
        "--learning-rate", type=_fraction, default=3e-3, help="AdamW learning rate (3e-3)"
    )
    parser.add_argument("--seed", type=whole("seed", minimum=0), default=0, help="default 0")
    node_options.add_argument(parser)
    parser.set_defaults(handler=_warm_start)


def _register_difficulty(commands: Any) -> None:
    parser = commands.add_parser(
        "difficulty",
        help="pre-score problems with a model and keep a difficulty band (offline filtering)",
        description=(
            "Sample --samples completions of each of --problems problems with the model, score "
            "them with the environment and write the problems whose mean task reward is within "
            "--keep LOW:HIGH as JSON Lines (id, problem, answer, mean_reward, prompt_id): a "
            "dataset the math environment's path key takes as it is."
        ),
    )
    parser.add_argument("--model", required=True, type=_model_dir, help="model dir")
    parser.add_argument("--out", required=True, type=Path, help="output JSONL file")
    parser.add_argument("--environment", default="reverse", help="environment (default reverse)")
    parser.add_argument(
        "--environment-config", type=_json_object, default={}, metavar="JSON", help="as JSON"
    )
    parser.add_argument("--problems", type=whole("problems"), default=64, help="default 64")
    parser.add_argument("--samples", type=whole("samples"), default=8, help="default 8")
    parser.add_argument(
        "--max-new-tokens", type=whole("tokens", maximum=4096), default=32, help="default 32"
    )
    parser.add_argument(
        "--keep", type=_band, default=(0.05, 0.95), metavar="LOW:HIGH", help="default 0.05:0.95"
    )
    parser.add_argument("--seed", type=whole("seed", minimum=0), default=0, help="default 0")
    node_options.add_argument(parser)
    parser.set_defaults(handler=_difficulty)
