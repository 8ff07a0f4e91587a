"""The coordinator conformance suite against the reference coordinator, in process, and against
deliberately broken ones: it must pass the first and catch the others."""

from __future__ import annotations

import grpc
import pytest
from conformance_testing import Running

from rollnet.sdk.conformance import (
    CASES,
    Outcome,
    Report,
    format_result,
    run_coordinator_suite,
)


def _print(report: Report) -> None:
    for result in report.results:
        print(format_result(result))
    print(report.summary())


@pytest.mark.slow
async def test_reference_coordinator_passes(running: Running) -> None:
    """Every case runs (nothing skipped: the suite was given every key and hook; one SQLite
    coordinator has no replica) and passes."""
    report = await run_coordinator_suite(running.target())
    _print(report)
    assert [r.name for r in report.results] == [c.name for c in CASES]
    skipped = [r.name for r in report.results if r.outcome is Outcome.SKIPPED]
    assert skipped == ["auth.replay_other_replica"], skipped
    failed = {r.name: r.detail for r in report.results if r.outcome is Outcome.FAILED}
    assert not failed, failed


@pytest.mark.postgres
@pytest.mark.timeout(120)
async def test_a_second_replica_on_postgresql_passes(second_replica: Running) -> None:
    """The suite against replica B of two coordinators on one PostgreSQL database."""
    report = await run_coordinator_suite(second_replica.target())
    _print(report)
    assert not [r.name for r in report.results if r.outcome is Outcome.SKIPPED]
    failed = {r.name: r.detail for r in report.results if r.outcome is Outcome.FAILED}
    assert not failed, failed


def _outcomes(report: Report) -> dict[str, Outcome]:
    return {result.name: result.outcome for result in report.results}


def _lenient_verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """RFC 8032 verification as OpenSSL does it: small-order keys and points accepted."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


async def test_catches_a_coordinator_that_skips_the_signature_check(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier that takes every signature: the cases that forge, alter or misdirect one
    fail; the checks before the signature (headers, audience, clock, body digest) still pass."""
    monkeypatch.setattr("rollnet.sdk.verifier.verify_signature", lambda *_: True)
    report = await run_coordinator_suite(running.target(), patterns=["auth"])
    _print(report)
    outcomes = _outcomes(report)
    for name in ("auth.forged", "auth.tampered_body", "auth.other_method", "auth.strict_ed25519"):
        assert outcomes[name] is Outcome.FAILED, name
    for name in ("auth.missing", "auth.malformed", "auth.clock_skew", "auth.audience"):
        assert outcomes[name] is Outcome.PASSED, name


async def test_catches_a_lenient_ed25519_verifier(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSL's RFC 8032 verification instead of the strict one protocol.md requires: honest
    signatures pass as before, and only the small-order key case fails."""
    monkeypatch.setattr("rollnet.sdk.verifier.verify_signature", _lenient_verify)
    report = await run_coordinator_suite(running.target(), patterns=["auth"])
    _print(report)
    failed = {r.name for r in report.results if r.outcome is Outcome.FAILED}
    assert failed == {"auth.strict_ed25519"}


async def test_catches_a_refusal_with_the_wrong_code(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator that answers a stale fencing token INVALID_ARGUMENT instead of
    FAILED_PRECONDITION (same reason): the cases that provoke it fail, and say why."""
    from rollnet.sdk.errors import REASON_CODES, ErrorReason

    monkeypatch.setitem(
        REASON_CODES,
        ErrorReason.FENCING_TOKEN_STALE,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    report = await run_coordinator_suite(running.target(), patterns=["dispatch.fencing"])
    _print(report)
    [result] = report.results
    assert result.outcome is Outcome.FAILED
    assert "expected FAILED_PRECONDITION/FENCING_TOKEN_STALE" in result.detail
    assert "got INVALID_ARGUMENT/FENCING_TOKEN_STALE" in result.detail


async def test_skips_what_it_was_not_given(running: Running) -> None:
    """Without keys, restart hook, invite or quota, the cases needing them are skipped (never
    passed), and those needing nothing still pass."""
    report = await run_coordinator_suite(
        running.target(
            keys={}, restart=None, invite_pool=None, invite_token=None, upload_quota_bytes=None
        ),
        patterns=["registration", "auth", "blob", "validation", "checkpoint", "node.ejected"],
    )
    _print(report)
    outcomes = _outcomes(report)
    for name in (
        "registration.invite",
        "registration.allow_listed",
        "auth.replay_after_restart",
        "auth.banned",
        "blob.quota",
        "validation.accept",
        "checkpoint.publish",
        "node.ejected",
    ):
        assert outcomes[name] is Outcome.SKIPPED, name
    for name in ("registration.new", "auth.replay", "blob.roundtrip", "registration.allow_list"):
        assert outcomes[name] is Outcome.PASSED, name
    assert report.ok, report.summary()
