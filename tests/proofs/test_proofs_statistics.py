"""Per-rollout statistics and the per-node sequential tests (``rollnet.sdk.proofs.statistics``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rollnet.sdk.proofs import statistics
from rollnet.sdk.proofs.logit_figures import token_figures
from rollnet.sdk.proofs.sampling import gumbel_noise, gumbel_noise_at, gumbel_scores
from rollnet.sdk.proofs.statistics import (
    DISPERSION_SCALE,
    NEAR_TIE_FLOOR,
    NodeEvidence,
    RolloutStatistics,
    StatisticsPolicy,
    judge,
    logprob_dispersion,
    rollout_statistics_batch,
    rollout_statistics_from_figures,
)
from rollnet.sdk.proofs.thresholds import (
    BFLOAT16,
    FLOAT32,
    LOGPROB_EVALUATION_SLACK,
    LOGPROB_RELATIVE_SLACK,
    sampling_tolerances,
)

VOCAB = 37
TEMPERATURE = 0.8


def sample(logits: np.ndarray, seed: int) -> list[int]:
    """The seeded Gumbel-max tokens (what an honest worker picks)."""
    return [int(t) for t in gumbel_scores(logits, seed, TEMPERATURE).argmax(axis=1)]


def steer(logits: np.ndarray, seed: int, preferred: int, tolerance: float) -> list[int]:
    """Pick ``preferred`` whenever its score is within ``tolerance`` of the best."""
    scores = gumbel_scores(logits, seed, TEMPERATURE)
    best = scores.max(axis=1)
    return [
        preferred if scores[row, preferred] >= best[row] - tolerance else int(scores[row].argmax())
        for row in range(scores.shape[0])
    ]


def reference(logits: np.ndarray, ids: list[int], seed: int, tolerance: float) -> RolloutStatistics:
    """One rollout token by token, straight from the definitions."""
    scores = gumbel_scores(logits, seed, TEMPERATURE)
    losses = wins = 0
    excess = variance = 0.0
    for row, token in enumerate(ids):
        others = np.delete(scores[row], token)
        ratio = (scores[row, token] - others.max()) / tolerance
        losses += -1 <= ratio < -NEAR_TIE_FLOOR
        wins += NEAR_TIE_FLOOR < ratio <= 1
        z = logits[row] / TEMPERATURE
        p = np.exp(z - z.max())
        p /= p.sum()
        log_p = np.log(p)
        entropy = -(p * log_p).sum()
        excess += log_p[token] + entropy
        variance += (p * log_p**2).sum() - entropy**2
    return RolloutStatistics(len(ids), losses, wins, excess, variance)


def test_the_vectorized_statistics_equal_the_definitions() -> None:
    rng = np.random.default_rng(1)
    tolerance = 0.5  # wide, so that band events occur in a few hundred tokens
    # The same tolerance on every row: no magnitude term, the floor at tolerance * T.
    thresholds = dataclasses.replace(
        FLOAT32, logit_error_relative=0.0, logit_error_floor=tolerance * TEMPERATURE
    )
    logits, ids, seeds = [], [], []
    for n, seed in ((40, 3), (1, 4), (75, 5)):
        z = rng.normal(0, 2, size=(n, VOCAB)).astype(np.float32)
        logits.append(z)
        ids.append(steer(z, seed, preferred=7, tolerance=0.45))
        seeds.append(seed)
    got = rollout_statistics_batch(
        logits, ids, seeds=seeds, temperature=TEMPERATURE, thresholds=thresholds
    )
    for z, chosen, seed, stats in zip(logits, ids, seeds, got, strict=True):
        want = reference(z.astype(np.float64), chosen, seed, tolerance)
        assert stats.tokens == want.tokens
        assert (stats.near_tie_losses, stats.near_tie_wins) == (
            want.near_tie_losses,
            want.near_tie_wins,
        )
        assert stats.logprob_excess == pytest.approx(want.logprob_excess, abs=1e-9)
        assert stats.logprob_variance == pytest.approx(want.logprob_variance, abs=1e-9)
    assert sum(s.near_tie_losses for s in got) > 0  # the steering shows


def test_honest_tokens_never_lose_and_steered_ones_do() -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(0, 1, size=(3000, VOCAB))
    honest = rollout_statistics_batch(
        [z], [sample(z, 9)], seeds=[9], temperature=TEMPERATURE, thresholds=BFLOAT16
    )[0]
    tolerance = float(sampling_tolerances(z, TEMPERATURE, BFLOAT16).min())
    steered_ids = steer(z, 9, preferred=3, tolerance=0.9 * tolerance)
    steered = rollout_statistics_batch(
        [z], [steered_ids], seeds=[9], temperature=TEMPERATURE, thresholds=BFLOAT16
    )[0]
    assert honest.near_tie_losses == 0
    assert honest.near_tie_wins > 0
    assert steered.near_tie_losses > 0


def test_the_logprob_excess_is_centred_for_honest_draws_only() -> None:
    rng = np.random.default_rng(3)
    z = rng.normal(0, 2, size=(4000, VOCAB))
    honest = rollout_statistics_batch(
        [z], [sample(z, 11)], seeds=[11], temperature=TEMPERATURE, thresholds=FLOAT32
    )[0]
    # A sharper sampler (T = 0.6 for 0.8) picks likelier tokens: the excess drifts up.
    sharp_ids = [int(t) for t in gumbel_scores(z, 11, 0.6).argmax(axis=1)]
    sharp = rollout_statistics_batch(
        [z], [sharp_ids], seeds=[11], temperature=TEMPERATURE, thresholds=FLOAT32
    )[0]
    assert abs(honest.logprob_excess) < 4 * math.sqrt(honest.logprob_variance)
    assert sharp.logprob_excess > 10 * math.sqrt(sharp.logprob_variance)


def test_bad_input_is_named() -> None:
    z = np.zeros((2, VOCAB))
    with pytest.raises(ValueError, match="rows must equal"):
        rollout_statistics_batch([z], [[1]], seeds=[1], temperature=1.0, thresholds=FLOAT32)
    with pytest.raises(ValueError, match="out of the vocabulary"):
        rollout_statistics_batch([z], [[1, VOCAB]], seeds=[1], temperature=1.0, thresholds=FLOAT32)
    with pytest.raises(ValueError, match="temperature"):
        rollout_statistics_batch([z], [[1, 2]], seeds=[1], temperature=0.0, thresholds=FLOAT32)
    with pytest.raises(ValueError, match="one logits array"):
        rollout_statistics_batch([z], [[1, 2]], seeds=[], temperature=1.0, thresholds=FLOAT32)


EOS = (35, 36)


def reference_with_eos(
    logits: np.ndarray, ids: list[int], seed: int, tolerances: np.ndarray
) -> RolloutStatistics:
    """One rollout token by token with EOS events, straight from the definitions."""
    scores = gumbel_scores(logits, seed, TEMPERATURE)
    counts = {"losses": 0, "wins": 0, "eos_losses": 0, "eos_passes": 0}
    for row, token in enumerate(ids):
        others = np.delete(scores[row], token)
        ratio = (scores[row, token] - others.max()) / tolerances[row]
        band_loss = -1 <= ratio < -NEAR_TIE_FLOOR
        eos_loss = eos_pass = False
        if token in EOS:
            eos_loss = band_loss
        else:
            gap = (max(scores[row, e] for e in EOS) - scores[row, token]) / tolerances[row]
            eos_pass = -1 <= gap < -NEAR_TIE_FLOOR and not band_loss
        counts["losses"] += band_loss and not eos_loss
        counts["wins"] += NEAR_TIE_FLOOR < ratio <= 1 and not eos_pass
        counts["eos_losses"] += eos_loss
        counts["eos_passes"] += eos_pass
    return RolloutStatistics(
        len(ids),
        counts["losses"],
        counts["wins"],
        0.0,
        0.0,
        eos_near_tie_losses=counts["eos_losses"],
        eos_near_tie_passes=counts["eos_passes"],
    )


def until_eos(logits: np.ndarray, seed: int, steering: float = 0.0) -> list[int]:
    """Seeded Gumbel-max tokens up to the first EOS; with ``steering`` > 0, EOS whenever its
    best score is within ``steering`` of the row's sampling tolerance of the winner's."""
    scores = gumbel_scores(logits, seed, TEMPERATURE)
    tolerances = sampling_tolerances(logits, TEMPERATURE, BFLOAT16)
    tokens = []
    for row in range(scores.shape[0]):
        token = int(scores[row].argmax())
        eos = max(EOS, key=lambda e: scores[row, e])
        if scores[row, eos] >= scores[row].max() - steering * tolerances[row]:
            token = eos
        tokens.append(token)
        if token in EOS:
            break
    return tokens


def eos_rollouts(seed: int, count: int, steering: float) -> list[RolloutStatistics]:
    """``count`` rollouts of up to 48 tokens on random logits where EOS is unlikely (so that it
    is rarely the runner-up): the near-tie band alone barely moves for an EOS steerer."""
    rng = np.random.default_rng(seed)
    logits, ids, seeds = [], [], []
    for number in range(count):
        z = rng.normal(0, 1, size=(48, VOCAB))
        z[:, list(EOS)] -= 2.0
        tokens = until_eos(z, number, steering)
        logits.append(z[: len(tokens)])
        ids.append(tokens)
        seeds.append(number)
    return rollout_statistics_batch(
        logits,
        ids,
        seeds=seeds,
        temperature=TEMPERATURE,
        thresholds=BFLOAT16,
        eos_token_ids=frozenset(EOS),
    )


def test_noise_at_a_few_columns_equals_the_full_rows() -> None:
    seeds, positions = np.array([5, 7, 2**40]), np.array([0, 3, 9])
    columns = np.array([[1, 199], [0, 5], [150, 150]])
    full = gumbel_noise(seeds, positions, 200)
    assert np.array_equal(
        gumbel_noise_at(seeds, positions, columns), np.take_along_axis(full, columns, axis=1)
    )
    with pytest.raises(ValueError, match=r"\[N, k\]"):
        gumbel_noise_at(seeds, positions, columns[:2])


def test_the_eos_events_equal_the_definitions() -> None:
    rng = np.random.default_rng(5)
    logits, ids, seeds = [], [], []
    for n, seed in ((60, 3), (1, 4), (90, 5), (30, 6)):
        z = rng.normal(0, 1, size=(n, VOCAB))
        z[:, list(EOS)] -= 0.5
        logits.append(z)
        # Steered rows everywhere (no stop): EOS losses and passes both occur.
        scores = gumbel_scores(z, seed, TEMPERATURE)
        tolerances = sampling_tolerances(z, TEMPERATURE, BFLOAT16)
        chosen = scores.argmax(axis=1)
        best_eos = np.asarray(EOS)[scores[:, list(EOS)].argmax(axis=1)]
        close = scores[np.arange(n), best_eos] >= scores.max(axis=1) - 0.9 * tolerances
        take = close & (rng.random(n) < 0.5)
        ids.append([int(t) for t in np.where(take, best_eos, chosen)])
        seeds.append(seed)
    got = rollout_statistics_batch(
        logits,
        ids,
        seeds=seeds,
        temperature=TEMPERATURE,
        thresholds=BFLOAT16,
        eos_token_ids=frozenset(EOS),
    )
    for z, chosen_ids, seed, stats in zip(logits, ids, seeds, got, strict=True):
        tolerances = sampling_tolerances(z, TEMPERATURE, BFLOAT16)
        want = reference_with_eos(z, chosen_ids, seed, tolerances)
        assert (
            stats.near_tie_losses,
            stats.near_tie_wins,
            stats.eos_near_tie_losses,
            stats.eos_near_tie_passes,
        ) == (
            want.near_tie_losses,
            want.near_tie_wins,
            want.eos_near_tie_losses,
            want.eos_near_tie_passes,
        )
    assert sum(s.eos_near_tie_losses for s in got) > 0
    assert sum(s.eos_near_tie_passes for s in got) > 0
    # Without EOS ids the same tokens are all band events.
    plain = rollout_statistics_batch(
        logits, ids, seeds=seeds, temperature=TEMPERATURE, thresholds=BFLOAT16
    )
    assert sum(s.near_tie_losses for s in plain) == sum(
        s.near_tie_losses + s.eos_near_tie_losses for s in got
    )
    with pytest.raises(ValueError, match="EOS token id"):
        rollout_statistics_batch(
            logits,
            ids,
            seeds=seeds,
            temperature=TEMPERATURE,
            thresholds=BFLOAT16,
            eos_token_ids=frozenset({VOCAB}),
        )


def node_flagged_at(
    pool: list[RolloutStatistics], policy: StatisticsPolicy, budget: int, seed: int
) -> int | None:
    """Tokens at which a node drawing verdicts of 8 rollouts from ``pool`` is flagged."""
    rng = np.random.default_rng(seed)
    evidence = NodeEvidence()
    while evidence.tokens < budget:
        evidence = evidence.add([pool[i] for i in rng.integers(0, len(pool), size=8)], policy)
        if judge(evidence, policy).flagged:
            return evidence.tokens
    return None


def test_an_eos_steerer_is_flagged_and_an_honest_node_is_not() -> None:
    policy = statistics.BFLOAT16_POLICY
    honest = eos_rollouts(7, 300, steering=0.0)
    steered = eos_rollouts(7, 300, steering=0.9)
    assert sum(s.eos_near_tie_losses for s in honest) == 0
    assert sum(s.eos_near_tie_passes for s in honest) > 0
    assert sum(s.eos_near_tie_losses for s in steered) > 0
    budget = 30_000
    for seed in range(5):
        assert node_flagged_at(honest, policy, budget, seed) is None
        assert node_flagged_at(steered, policy, budget, seed) is not None
    # The same steered tokens counted as band events only (no EOS ids) are not flagged: the
    # EOS events are what catch it.
    band_only = [
        dataclasses.replace(
            s,
            near_tie_losses=s.near_tie_losses + s.eos_near_tie_losses,
            near_tie_wins=s.near_tie_wins + s.eos_near_tie_passes,
            eos_near_tie_losses=0,
            eos_near_tie_passes=0,
        )
        for s in steered
    ]
    assert node_flagged_at(band_only, policy, budget, 0) is None


def test_eos_events_have_their_own_cusum() -> None:
    stats = RolloutStatistics(50, 0, 0, 0.0, 1.0, eos_near_tie_losses=2, eos_near_tie_passes=3)
    evidence = NodeEvidence().add([stats], POLICY)
    llr = 2 * math.log(0.2 / 0.002) + 3 * math.log(0.8 / 0.998)
    assert evidence.eos_cusum == pytest.approx(llr)
    assert evidence.near_tie_cusum == 0.0
    assert (evidence.eos_near_tie_losses, evidence.eos_near_tie_passes) == (2, 3)
    with pytest.raises(ValueError, match="out of range"):
        NodeEvidence().add([dataclasses.replace(stats, near_tie_wins=46)], POLICY)
    with pytest.raises(ValueError, match="honest_eos_loss_rate"):
        dataclasses.replace(POLICY, honest_eos_loss_rate=0.3)


POLICY = StatisticsPolicy(
    honest_loss_rate=0.05, alternative_loss_rate=0.2, logprob_drift=0.1, min_tokens=100
)


def test_the_cusum_adds_log_likelihood_ratios_and_restarts_at_zero() -> None:
    evidence = NodeEvidence().add([RolloutStatistics(50, 3, 7, 1.5, 20.0)], POLICY)
    llr = 3 * math.log(0.2 / 0.05) + 7 * math.log(0.8 / 0.95)
    assert evidence.near_tie_cusum == pytest.approx(llr)
    assert evidence.logprob_high_cusum == pytest.approx(0.1 * 1.5 - 0.01 * 20 / 2)
    assert evidence.logprob_low_cusum == 0.0
    wins_only = evidence.add([RolloutStatistics(50, 0, 40, 0.0, 1.0)], POLICY)
    assert wins_only.near_tie_cusum == 0.0  # never below zero: the next evidence counts fully
    assert (wins_only.tokens, wins_only.near_tie_wins) == (100, 47)


def test_the_threshold_is_derived_and_min_tokens_gates_the_flag() -> None:
    assert POLICY.flag_threshold == pytest.approx(math.log(1e7 * 5 / 1e-6))
    steering = RolloutStatistics(50, 20, 5, 0.0, 10.0)
    evidence = NodeEvidence()
    history = []
    while not judge(evidence, POLICY).flagged:
        evidence = evidence.add([steering], POLICY)
        history.append(evidence)
        assert len(history) < 100
    first = judge(evidence, POLICY)
    assert first.test == "near_tie"
    assert first.statistic >= POLICY.flag_threshold
    assert evidence.tokens >= POLICY.min_tokens
    early = NodeEvidence(tokens=10, near_tie_cusum=1e3)
    assert not judge(early, POLICY).flagged


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (RolloutStatistics(5, 4, 2, 0.0, 1.0), "out of range"),  # losses + wins > tokens
        (RolloutStatistics(5, 0, 0, math.nan, 1.0), "finite"),
        (RolloutStatistics(5, 0, 0, 0.0, -1.0), "out of range"),
    ],
)
def test_evidence_refuses_impossible_statistics(bad: RolloutStatistics, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NodeEvidence().add([bad], POLICY)


@pytest.mark.slow
def test_honest_false_flags_stay_under_the_ville_bound() -> None:
    """A deliberately weak policy (alpha = 0.2 over 200 updates) so that false flags occur:
    an honest node at exactly pi0 is flagged in at most about alpha of its lifetimes."""
    policy = StatisticsPolicy(
        honest_loss_rate=0.1,
        alternative_loss_rate=0.3,
        logprob_drift=0.1,
        min_tokens=0,
        false_flag_probability=0.2,
        horizon_tokens=200,
    )
    rng = np.random.default_rng(4)
    flagged = 0
    runs = 2000
    for _ in range(runs):
        evidence = NodeEvidence()
        for _ in range(200):
            events = int(rng.integers(0, 4))
            losses = int(rng.binomial(events, 0.1))
            draw = RolloutStatistics(4, losses, events - losses, 0.0, 0.0)
            evidence = evidence.add([draw], policy)
            if judge(evidence, policy).flagged:
                flagged += 1
                break
    # The bound is 0.2; the binomial noise of 2,000 runs is ~0.01.
    assert flagged / runs <= 0.2 + 0.03
    assert statistics.policy_for("bf16") is statistics.BFLOAT16_POLICY
    with pytest.raises(ValueError, match="float16"):
        statistics.policy_for("float16")


def _figures_and_claims(
    noise: float, rollouts: int = 16, tokens: int = 40, seed: int = 11
) -> tuple[list[RolloutStatistics], np.ndarray]:
    """Honest-sampled rollouts on bf16-sized logits whose worker saw the logits moved by
    ``noise`` (logit units, Gaussian per logit): the statistics with the worker's reported
    log-probabilities, and every token's dispersion ``Y``."""
    rng = np.random.default_rng(seed)
    logits = [rng.normal(0, 2, size=(tokens, VOCAB)) for _ in range(rollouts)]
    ids = [sample(z, s) for s, z in enumerate(logits)]
    claimed = []
    for z, chosen in zip(logits, ids, strict=True):
        worker = (z + rng.normal(0, noise, size=z.shape)) / TEMPERATURE
        worker -= worker.max(axis=1, keepdims=True)
        log_p = worker - np.log(np.exp(worker).sum(axis=1, keepdims=True))
        claimed.append(log_p[np.arange(tokens), chosen].tolist())
    figures = token_figures(
        logits, ids, seeds=list(range(rollouts)), temperature=TEMPERATURE, thresholds=BFLOAT16
    )
    stats = rollout_statistics_from_figures(figures, logits, ids, list(range(rollouts)), claimed)
    y = logprob_dispersion(
        np.concatenate(claimed), figures.logprobs, figures.others, figures.tolerances
    )
    return stats, y


def test_the_dispersion_equals_its_definition_and_is_summed_per_rollout() -> None:
    stats, y = _figures_and_claims(noise=1e-3)
    assert all(s.dispersion_tokens == s.tokens == 40 for s in stats)
    assert sum(s.logprob_dispersion for s in stats) == pytest.approx(float(y.sum()))
    assert stats[0].logprob_dispersion == pytest.approx(float(y[:40].sum()))
    assert ((y >= 0) & (y <= 1)).all()
    # By hand for one token: d / (c s), s the half-width of the honest interval.
    value, others, tolerance, claimed = -1.2, 0.9, 0.05, -1.2 + 0.001
    half = (np.logaddexp(0, others + tolerance) - np.logaddexp(0, others - tolerance)) / 2
    # The float32 evaluation slack is added to the unit unscaled.
    slack = LOGPROB_EVALUATION_SLACK + LOGPROB_RELATIVE_SLACK * abs(value)
    expected = ((claimed - value) / (DISPERSION_SCALE * half + slack)) ** 2
    got = logprob_dispersion([claimed], [value], [others], [tolerance])
    assert got[0] == pytest.approx(min(expected, 1.0))
    # Far outside the unit, and non-finite figures, count as the cap.
    assert logprob_dispersion([0.0, math.nan], [-5.0, -1.0], [5.0, 1.0], [0.05, 0.05]).tolist() == [
        1.0,
        1.0,
    ]


def test_the_dispersion_is_small_for_honest_noise_and_grows_with_a_cheaper_model() -> None:
    """Honest noise (~1/400 of these logits' bf16 tolerance, ~0.2) keeps the mean ``Y``
    small; a worker whose logits carry twenty times that (a cheaper model) nears the cap."""
    _, honest = _figures_and_claims(noise=5e-4)
    _, cheap = _figures_and_claims(noise=1e-2)
    assert honest.mean() < 0.05
    assert cheap.mean() > 0.7


def test_no_claimed_logprobs_no_dispersion() -> None:
    rng = np.random.default_rng(3)
    logits = [rng.normal(0, 2, size=(12, VOCAB)) for _ in range(2)]
    ids = [sample(z, s) for s, z in enumerate(logits)]
    figures = token_figures(logits, ids, seeds=[0, 1], temperature=TEMPERATURE, thresholds=BFLOAT16)
    plain = rollout_statistics_from_figures(figures, logits, ids, [0, 1])
    partial = rollout_statistics_from_figures(figures, logits, ids, [0, 1], [None, [0.0] * 3])
    for s in (*plain, *partial):
        assert (s.logprob_dispersion, s.dispersion_tokens) == (0.0, 0)


def test_the_dispersion_test_flags_a_drifting_node_and_not_an_honest_one() -> None:
    """Bernoulli-form CUSUM on the sums: a node whose tokens' mean ``Y`` exceeds ``mu1`` is
    flagged by the dispersion test; one at ``mu0`` (the honest bound) is not within 10^5
    tokens; out-of-range sums are refused."""
    policy = statistics.BFLOAT16_POLICY
    mu0, mu1 = policy.honest_dispersion, policy.alternative_dispersion
    one = NodeEvidence().add([RolloutStatistics(40, 0, 0, 0.0, 1.0, 0, 0, 30.0, 40)], policy)
    llr = 30 * math.log(mu1 / mu0) + 10 * math.log((1 - mu1) / (1 - mu0))
    assert one.dispersion_cusum == pytest.approx(max(0.0, llr))
    assert (one.logprob_dispersion, one.dispersion_tokens) == (30.0, 40)
    rng = np.random.default_rng(8)

    def tokens_to_flag(mean: float) -> int | None:
        evidence = NodeEvidence()
        while evidence.tokens < 100_000:
            y = np.minimum(rng.exponential(mean, size=(8, 40)), 1.0)
            batch = [RolloutStatistics(40, 0, 0, 0.0, 1.0, 0, 0, float(r.sum()), 40) for r in y]
            evidence = evidence.add(batch, policy)
            verdict = judge(evidence, policy)
            if verdict.flagged:
                assert verdict.test == "dispersion"
                return evidence.tokens
        return None

    # Exponential draws capped at 1: mean 0.46 (mu0, the honest bound) and 0.94 (over mu1).
    assert tokens_to_flag(0.55) is None
    flagged = tokens_to_flag(8.0)
    assert flagged is not None
    assert flagged < 5_000
    for bad in (
        RolloutStatistics(40, 0, 0, 0.0, 1.0, 0, 0, 41.0, 40),  # over its token count
        RolloutStatistics(40, 0, 0, 0.0, 1.0, 0, 0, 1.0, 41),  # more tokens than the rollout
        RolloutStatistics(40, 0, 0, 0.0, 1.0, 0, 0, -1.0, 40),
    ):
        with pytest.raises(ValueError, match="dispersion"):
            NodeEvidence().add([bad], policy)
    with pytest.raises(ValueError, match="honest_dispersion"):
        dataclasses.replace(policy, honest_dispersion=0.9)


def test_a_rollout_at_the_cap_sums_to_at_most_its_tokens() -> None:
    """Every token at the cap (reports 40 nats off): the sum is exactly the token count, which
    the wire requires it not to exceed, rounding or not."""
    rng = np.random.default_rng(5)
    logits = [rng.normal(0, 2, size=(41, VOCAB)) for _ in range(3)]
    ids = [sample(z, s) for s, z in enumerate(logits)]
    figures = token_figures(
        logits, ids, seeds=[0, 1, 2], temperature=TEMPERATURE, thresholds=BFLOAT16
    )
    claimed: list[list[float] | None] = [[-40.0] * 41 for _ in range(3)]
    stats = rollout_statistics_from_figures(figures, logits, ids, [0, 1, 2], claimed)
    assert all(s.logprob_dispersion == s.dispersion_tokens == 41 for s in stats)


def test_float32_rounding_of_a_near_certain_token_is_not_dispersion() -> None:
    """A token with p ~ 1 has an honest interval of ~0 width: a worker's float32 rounding of
    its log-probability (within the evaluation slack) must stay far from the cap."""
    value = -1e-7
    rounded = float(np.float32(value) + np.float32(2e-7))
    y = logprob_dispersion([rounded], [value], [-16.0], [1e-4])
    assert y[0] < 0.1
