"""Canonical JSON, the config digest and configuration validation."""

from __future__ import annotations

import json

import blake3
import pytest
from google.protobuf import json_format, struct_pb2

from rollnet.reference.envs import (
    ArithmeticEnvironment,
    EnvironmentConfigError,
    MathEnvironment,
    canonical_json,
    config_digest,
    load_environment,
)
from rollnet.sdk.domains import CONFIG_DIGEST_DOMAIN


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # ECMAScript number forms, as RFC 8785 requires.
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (0.0003, "0.0003"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (123.456, "123.456"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.2345678901234568e20, "123456789012345680000"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-2.5e-8, "-2.5e-8"),
        (2**53 - 1, "9007199254740991"),
        (-42, "-42"),
        (True, "true"),
        (None, "null"),
        ('a"b\\c\n\u0001é€😀', '"a\\"b\\\\c\\n\\u0001é€😀"'),
        # Keys sort by UTF-16 code units: U+1F600 (surrogates D83D…) sorts before U+FB01.
        ({"b": 1, "a": [1, 2.5, {}], "\ufb01": 0, "😀": 1}, '{"a":[1,2.5,{}],"b":1,"😀":1,"ﬁ":0}'),
    ],
)
def test_canonical_json_matches_rfc8785(value: object, expected: str) -> None:
    assert canonical_json(value) == expected.encode("utf-8")


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), 2**53, -(2**53), {1: 2}, b"x", {1.5}]
)
def test_canonical_json_refuses_what_cannot_travel(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        canonical_json(value)


def test_config_digest_is_blake3_of_domain_and_canonical_document() -> None:
    config = {"seed": 7, "length_penalty": 0.0003}
    document = b'{"config":{"length_penalty":0.0003,"seed":7},"name":"arithmetic"}'
    assert (
        config_digest("arithmetic", config)
        == blake3.blake3(CONFIG_DIGEST_DOMAIN + document).hexdigest()
    )
    # Key order and int-versus-float spelling of the same number do not matter ...
    assert config_digest("arithmetic", {"length_penalty": 3e-4, "seed": 7}) == config_digest(
        "arithmetic", config
    )
    assert config_digest("x", {"a": 1}) == config_digest("x", {"a": 1.0})
    # ... the name and every value do.
    assert config_digest("math", config) != config_digest("arithmetic", config)
    assert config_digest("arithmetic", {**config, "seed": 8}) != config_digest("arithmetic", config)


def test_normalised_config_spells_out_defaults_and_is_stable() -> None:
    implicit = ArithmeticEnvironment({})
    explicit = ArithmeticEnvironment(
        {"seed": 0, "level": 1, "operators": "+", "length_penalty": 3e-4}
    )
    assert implicit.config == explicit.config
    assert implicit.digest == explicit.digest
    assert ArithmeticEnvironment({"operators": "*-+", "level": 5}).config["operators"] == "+-*"
    # The normalised config round-trips through JSON (it travels inside tasks) to the same digest.
    reloaded = load_environment("arithmetic", json.loads(json.dumps(implicit.config)))
    assert reloaded.digest == implicit.digest
    # Pinned: changing a default or the digest recipe changes every task's environment identity.
    assert implicit.digest == "da240718abf374269c8010e7093254cdfc087493e4f5d1f68a9727bd09baf3f2"


@pytest.mark.parametrize(
    ("name", "config"),
    [
        (
            "arithmetic",
            {"level": 5, "seed": 9, "target_lengths": [16, 32], "length_penalty": 0.001},
        ),
        ("math", {"target_lengths": [1000], "max_answer_chars": 512, "verify_timeout_s": 2}),
    ],
)
def test_config_survives_a_trip_through_protobuf_struct(
    name: str, config: dict[str, object]
) -> None:
    # Tasks carry the config as google.protobuf.Struct, where every number becomes a double.
    original = load_environment(name, config)
    struct = struct_pb2.Struct()
    struct.update(original.config)
    received = json_format.MessageToDict(struct)
    assert isinstance(received["seed"], float)
    rebuilt = load_environment(name, received)
    assert rebuilt.config == original.config
    assert rebuilt.digest == original.digest
    assert config_digest(name, received) == original.digest
    assert [rebuilt.prompt(i) for i in range(5)] == [original.prompt(i) for i in range(5)]


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"sed": 1}, "sed"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**53}, "seed"),
        ({"seed": "1"}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"level": 0}, "level"),
        ({"level": 99}, "level"),
        ({"min_digits": 0}, "min_digits"),
        ({"max_digits": 10}, "max_digits"),
        ({"min_digits": 3, "max_digits": 2}, "max_digits"),
        ({"operators": ""}, "operators"),
        ({"operators": "/"}, "operators"),
        ({"operators": "++"}, "operators"),
        ({"operators": ["+"]}, "operators"),
        ({"allow_negative": 1}, "allow_negative"),
        ({"target_lengths": [0]}, "target_lengths"),
        ({"target_lengths": [4, 4]}, "target_lengths"),
        ({"target_lengths": "4"}, "target_lengths"),
        ({"target_lengths": [4.5]}, "target_lengths"),
        ({"target_lengths": [True]}, "target_lengths"),
        ({"length_penalty": -0.1}, "length_penalty"),
        ({"length_penalty": float("nan")}, "length_penalty"),
        ({"length_template": "{prompt}"}, "length_template"),
        ({"length_template": "{target}{target}{prompt}"}, "length_template"),
    ],
)
def test_bad_arithmetic_config_names_the_key(config: dict[str, object], key: str) -> None:
    with pytest.raises(EnvironmentConfigError) as caught:
        load_environment("arithmetic", config)
    assert caught.value.key == key
    assert f"'{key}'" in str(caught.value)
    assert "'arithmetic'" in str(caught.value)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"prompt_template": "no placeholder"}, "prompt_template"),
        ({"max_answer_chars": 0}, "max_answer_chars"),
        ({"verify_timeout_s": -1}, "verify_timeout_s"),
        ({"verify_timeout_s": 0.5}, "verify_timeout_s"),
        ({"path": 3}, "path"),
        ({"answer_key": "x"}, "answer_key"),
    ],
)
def test_bad_math_config_names_the_key(config: dict[str, object], key: str) -> None:
    with pytest.raises(EnvironmentConfigError) as caught:
        MathEnvironment(config)
    assert caught.value.key == key


def test_config_must_be_a_mapping() -> None:
    with pytest.raises(EnvironmentConfigError, match="expected a mapping"):
        load_environment("arithmetic", [("seed", 1)])  # type: ignore[arg-type]
