"""Per-rollout sufficient statistics and the per-node sequential tests built on them.

A per-token check passes any token within tolerance, and on bf16 networks the honest tolerance is
as large as what a cheaper model or a steering worker changes. One token says little; a node's
thousands of tokens say a lot. The validator condenses each accepted rollout into a few sums
(:class:`RolloutStatistics`, computed from the prefill it already ran), the coordinator adds them
up per node (:class:`NodeEvidence`), and five sequential tests decide whether the node's tokens
still look like honest draws from the checkpoint (:func:`judge`):

* **Near-tie losses.** With ``r = margin / tolerance`` per token (``margin`` the chosen token's
  seeded Gumbel score minus the best other score, from the validator's logits), a *loss* is a
  token with ``-1 <= r < -b`` and a *win* one with ``b < r <= 1`` (``b`` =
  :data:`NEAR_TIE_FLOOR`). Honest numeric noise moves scores by far less than ``b`` tolerances,
  so an honest node's band losses are rare next to its band wins (a loss needs noise larger than
  ``b`` tolerances). A worker that swaps in a preferred token whenever it is within tolerance of
  the winner (steering) or a model whose scores differ by a good fraction of the tolerance
  (cheap substitutes) turns band wins into band losses. Given the band events, the number of
  losses is binomial with a rate ``pi`` that the test bounds: H0 ``pi <= pi0``, H1 ``pi = pi1``.
* **EOS near-ties.** EOS is rarely the runner-up, so a worker that stops early by taking EOS
  whenever its score is within tolerance of the winner's changes too few tokens to move the
  band's loss share. The validator knows EOS's seeded score at every position, so it counts
  the positions where EOS was a near-tie *loser* (its score ``b`` to 1 tolerances below the
  chosen token's): an *EOS loss* when EOS was nonetheless chosen (a band loss whose token is
  EOS), an *EOS pass* when the chosen token is another one that is not itself a band loss.
  An honest worker takes EOS there no more often than it takes any band loss; a steerer takes
  it every time. Same binomial form, H0 ``q <= q0``, H1 ``q = q1``, its own CUSUM: in one
  CUSUM with the band test, an EOS steerer's few EOS losses would be cancelled by the many
  honest-looking band wins. EOS events are taken out of the band counts (the two sets of
  events are disjoint), so EOS steering moves only its own test.
* **Chosen-token log-probability.** ``x_t = log p_t(y_t) + H_t`` under the validator's
  distribution ``p_t`` has mean 0 and variance ``Var_t = sum p log^2 p - H_t^2`` when ``y_t`` is
  drawn from ``p_t``; its sum drifts when the tokens come from another distribution (steering to
  unlikely tokens: negative; a sharper sampler such as T = 0.95 for 1.0: positive). Two one-sided
  tests on ``(S, V) = (sum x_t, sum Var_t)``.
* **Log-probability dispersion.** Every token carries the worker's reported log-probability
  ``lp_w`` and the validator's ``lp_v``; ``d = lp_w - lp_v`` is the worker's numeric discrepancy
  on *every* token, not only near-ties. Per token ``Y = min((d / (c s + e))^2, 1)`` with ``s``
  the half-width of the token's honest log-probability interval (the error model's, which
  follows dtype, temperature and magnitude), ``c`` = :data:`DISPERSION_SCALE` and ``e`` the
  float32 evaluation slack. A cheaper model (int8
  weights, an fp8 KV cache, noisy weights) adds its own error to ``d``, and the worker cannot
  shrink it without knowing ``lp_v``. ``Y`` is in ``[0, 1]``, so the binomial test's form holds
  for its sums too: H0 ``E[Y] <= mu0``, H1 ``E[Y] = mu1``, ``llr = sum Y ln(mu1/mu0) + (n -
  sum Y) ln((1 - mu1)/(1 - mu0))`` (``exp(llr)`` is convex in each ``Y``, so its mean is at most
  the Bernoulli one, 1, when ``E[Y] <= mu0``).

Each test is a CUSUM of log-likelihood ratios kept as one number per node and test (the coordinator
stores it): ``C <- max(0, C + llr)``. All tests hold at every temperature the coordinator admits:
margins are taken in units of each token's own tolerance, which follows the error model (dtype,
logit magnitude, 1 / T), so ``r`` means the same at T = 0.001 and at 2. The false-flag probability
is derived, not guessed: ``C_n >= h`` means that for some restart point ``k`` the likelihood ratio
of updates ``k+1..n`` is at least ``e^h``; for a fixed ``k`` that ratio is a non-negative
supermartingale with mean at most 1 under H0, so by Ville's inequality it ever reaches ``e^h`` with
probability at most ``e^-h``; a union over at most ``K`` restart points (one per verdict; ``K`` <=
tokens) gives ``P(flag) <= K e^-h``. Each policy sets ``h = ln(K m / alpha)`` for ``m`` = 5 CUSUMs,
``K`` = 10^7 and ``alpha`` = 10^-6: an honest node is flagged with probability at most 10^-6 in its
first 10^7 tokens. The binomial test's supermartingale property is exact given ``pi <= pi0`` (the
calibrated honest rates, with margin); the log-probability test's is exact for Gaussian increments
and holds approximately (central limit) for sums over many tokens, which is why it only runs after
:attr:`StatisticsPolicy.min_tokens`. ``docs/verification.md`` ("Per-node statistics") has the
measured rates.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.sampling import (
    _MARGIN_CHUNK_ELEMENTS,
    _batch_margins,
    check_seed,
    gumbel_noise_at,
)
from rollnet.sdk.proofs.thresholds import (
    LOGPROB_EVALUATION_SLACK,
    LOGPROB_RELATIVE_SLACK,
    Thresholds,
    softplus,
)

if TYPE_CHECKING:
    from rollnet.sdk.proofs.logit_figures import TokenFigures

NEAR_TIE_FLOOR = 0.1
"""``b``: band events have ``b < |margin| / tolerance <= 1``. Honest numeric noise rarely reaches
it (the honest loss share is bounded by ``pi0``, measured across T = 0.001-2.0 per dtype)."""


DISPERSION_SCALE = 0.03
"""``c``: the dispersion statistic's unit, as a fraction of each token's honest log-probability
half-width ``s``. Honest bf16 discrepancies are mostly under 0.03 ``s`` (medians 0.0003-0.009 over
the calibration's variations), cheap substitutes' mostly above (int8 weights: median 0.028,
1 % weight noise 0.049); ``docs/verification.md`` has the figures."""


@dataclass(frozen=True)
class RolloutStatistics:
    """Sufficient statistics of one rollout's tokens for the per-node tests."""

    tokens: int
    """Completion tokens summarized."""
    near_tie_losses: int
    """Tokens whose margin / tolerance is in ``[-1, -b)``: the chosen token lost the seeded race
    under the validator's logits by more than honest noise explains, but within tolerance."""
    near_tie_wins: int
    """Tokens whose margin / tolerance is in ``(b, 1]``: won by a similar small margin."""
    logprob_excess: float
    """``sum_t (log p_t(y_t) + H_t)`` under the validator's sampling distribution (nats)."""
    logprob_variance: float
    """``sum_t Var_{y ~ p_t}(log p_t(y))``: the excess's variance for honest draws (nats^2)."""
    eos_near_tie_losses: int = 0
    """Tokens that are EOS with margin / tolerance in ``[-1, -b)`` (not in ``near_tie_losses``)."""
    eos_near_tie_passes: int = 0
    """Tokens that are not EOS and not a band loss, where the best EOS score was ``b`` to 1
    tolerances below the chosen token's (not in ``near_tie_wins``)."""
    logprob_dispersion: float = 0.0
    """``sum_t min((d_t / (c s_t + e_t))^2, 1)`` over :attr:`dispersion_tokens`
    (:func:`logprob_dispersion`): the worker's reported log-probabilities' spread around the
    validator's."""
    dispersion_tokens: int = 0
    """Tokens the dispersion sums over: every token when the worker's log-probabilities were
    compared, 0 when they were not."""


def logprob_dispersion(
    claimed: npt.ArrayLike,
    logprobs: npt.ArrayLike,
    others: npt.ArrayLike,
    score_tolerances: npt.ArrayLike,
) -> npt.NDArray[np.float64]:
    """Per token ``Y = min((d / u)^2, 1)``: ``d`` the claimed minus the validator's
    log-probability, ``u = c h + e`` its unit. ``h`` is the half-width of the honest interval
    the error model gives (``softplus(L + delta)`` to ``softplus(L - delta)``, ``L`` =
    ``others`` as in :class:`~rollnet.sdk.proofs.logit_figures.TokenFigures`, ``delta`` the
    score tolerance), ``c`` = :data:`DISPERSION_SCALE`, and ``e`` the float32 evaluation slack
    of :func:`~rollnet.sdk.proofs.thresholds.logprob_bounds`, not scaled by ``c``: the worker's
    float32 ``log_softmax`` rounds by up to ``e`` whatever its model, so a near-certain token
    (``h`` tiny) must not count that rounding as dispersion. A non-finite figure counts as the
    cap, 1."""
    values = np.asarray(logprobs, dtype=np.float64)
    lengths = np.asarray(others, dtype=np.float64)
    delta = np.asarray(score_tolerances, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        half = (softplus(lengths + delta) - softplus(lengths - delta)) / 2
        slack = LOGPROB_EVALUATION_SLACK + LOGPROB_RELATIVE_SLACK * np.abs(values)
        ratio = (np.asarray(claimed, dtype=np.float64) - values) / (DISPERSION_SCALE * half + slack)
        squared = ratio * ratio
    return np.where(np.isfinite(squared), np.minimum(squared, 1.0), 1.0)


def _distribution_moments(
    arrays: Sequence[npt.NDArray[Any]], ids: npt.NDArray[np.int64], temperature: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per token of the stacked rows: ``log p(y)``, entropy ``H`` and ``Var(log p)``.

    With ``s`` the max-shifted scaled logits and ``Z = sum exp(s)``: ``log p = s - log Z``, so
    ``H = log Z - E_p[s]`` and ``Var(log p) = Var_p(s) = E_p[s^2] - E_p[s]^2`` — two weighted
    row sums over one ``exp``, no ``[rows, V]`` log-probability array."""
    total = int(ids.size)
    chosen = np.empty(total, dtype=np.float64)
    entropy = np.empty(total, dtype=np.float64)
    variance = np.empty(total, dtype=np.float64)
    vocab = arrays[0].shape[1]
    step = max(1, _MARGIN_CHUNK_ELEMENTS // vocab)
    stacked = itertools.chain.from_iterable(
        (z[i : i + step] for i in range(0, z.shape[0], step)) for z in arrays
    )
    start = 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for block in stacked:
            if block.shape[0] == 0:
                continue
            stop = start + block.shape[0]
            shifted = block.astype(np.float64) / temperature
            shifted -= shifted.max(axis=1, keepdims=True)
            weights = np.exp(shifted)
            norm = weights.sum(axis=1)
            log_norm = np.log(norm)
            first = np.einsum("ij,ij->i", weights, shifted) / norm
            weights *= shifted
            second = np.einsum("ij,ij->i", weights, shifted) / norm
            chosen[start:stop] = shifted[np.arange(block.shape[0]), ids[start:stop]] - log_norm
            entropy[start:stop] = log_norm - first
            variance[start:stop] = np.maximum(second - first * first, 0.0)
            start = stop
    return chosen, entropy, variance


def rollout_statistics_batch(
    logits: Sequence[npt.ArrayLike],
    completion_ids: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    temperature: float,
    thresholds: Thresholds,
    eos_token_ids: Collection[int] = frozenset(),
) -> list[RolloutStatistics]:
    """:class:`RolloutStatistics` of many rollouts from the validator's logits (``[tokens, V]``
    completion rows, as for :func:`rollnet.sdk.proofs.sampling.check_sampling_batch`), every
    token of every rollout in one vectorized pass. Rollouts whose tokens fail the sampling
    check are rejected anyway; their statistics are computed all the same (never sent). No
    EOS ids: no EOS events (every near-tie counts in the band)."""
    if not len(logits) == len(completion_ids) == len(seeds):
        raise ValueError("one logits array, completion and seed per rollout")
    if not temperature > 0:
        raise ValueError("statistics need a temperature > 0")
    arrays = [np.asarray(z) for z in logits]
    if not arrays:
        return []
    if any(z.ndim != 2 for z in arrays) or len({z.shape[1] for z in arrays}) > 1:
        raise ValueError("logits must be [tokens, vocabulary] with one vocabulary")
    lengths = np.asarray([len(ids) for ids in completion_ids], dtype=np.int64)
    if any(z.shape[0] != n for z, n in zip(arrays, lengths.tolist(), strict=True)):
        raise ValueError("logits rows must equal the completion length")
    vocab = arrays[0].shape[1]
    ids = np.fromiter(itertools.chain.from_iterable(completion_ids), dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError("token id out of the vocabulary")
    for seed in seeds:
        check_seed(seed)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    seed_rows = np.repeat(np.asarray(seeds, dtype=np.int64), lengths)
    positions = np.arange(ids.size, dtype=np.int64) - np.repeat(starts[:-1], lengths)
    # Each token's margin and its sampling check's own tolerance, in one pass over the logits.
    margins, tolerances = _batch_margins(arrays, ids, seed_rows, positions, temperature, thresholds)
    chosen, entropy, variance = _distribution_moments(arrays, ids, temperature)
    eos_gaps = eos_score_gaps(arrays, ids, seed_rows, positions, temperature, eos_token_ids)
    chosen_eos = np.isin(ids, np.fromiter(eos_token_ids, dtype=np.int64))
    return _statistics(
        lengths, margins, tolerances, chosen + entropy, variance, eos_gaps, chosen_eos
    )


def rollout_statistics_from_figures(
    figures: TokenFigures,
    logits: Sequence[npt.ArrayLike],
    completion_ids: Sequence[Sequence[int]],
    seeds: Sequence[int],
    claimed_logprobs: Sequence[Sequence[float] | None] | None = None,
) -> list[RolloutStatistics]:
    """:func:`rollout_statistics_batch` from the per-token figures of
    :func:`rollnet.sdk.proofs.logit_figures.token_figures` (the same sums), plus the EOS
    columns of the logits the figures were computed from (EOS events), and the dispersion of
    each rollout's ``claimed_logprobs`` (the worker's behaviour log-probabilities, one per
    completion token; None, or a list of another length: no dispersion for that rollout, whose
    log-probability check fails anyway). Raises ``ValueError`` when a rollout has a token
    outside the vocabulary, as it does."""
    if figures.out_of_vocabulary.any():
        raise ValueError("token id out of the vocabulary")
    if not len(logits) == len(completion_ids) == len(seeds) == figures.lengths.size:
        raise ValueError("one logits array, completion and seed per rollout of the figures")
    arrays = [np.asarray(z) for z in logits]
    ids = np.fromiter(itertools.chain.from_iterable(completion_ids), dtype=np.int64)
    lengths = figures.lengths
    starts = figures.starts
    seed_rows = np.repeat(np.asarray(seeds, dtype=np.int64), lengths)
    positions = np.arange(ids.size, dtype=np.int64) - np.repeat(starts[:-1], lengths)
    eos_gaps = eos_score_gaps(
        arrays, ids, seed_rows, positions, figures.temperature, figures.eos_token_ids
    )
    compared = np.zeros(lengths.size, dtype=bool)
    claimed = np.full(ids.size, np.nan)
    for index, values in enumerate(claimed_logprobs or ()):
        if values is not None and len(values) == lengths[index]:
            compared[index] = True
            claimed[starts[index] : starts[index + 1]] = np.asarray(values, dtype=np.float64)
    rows = np.repeat(compared, lengths)
    dispersion = np.zeros(ids.size, dtype=np.float64)
    dispersion[rows] = logprob_dispersion(
        claimed[rows], figures.logprobs[rows], figures.others[rows], figures.tolerances[rows]
    )
    statistics = _statistics(
        lengths,
        figures.margins,
        figures.tolerances,
        figures.logprobs + figures.entropy,
        figures.variance,
        eos_gaps,
        np.isin(ids, np.fromiter(figures.eos_token_ids, dtype=np.int64)),
    )
    # Each rollout's own sum (no running-sum differences), at most its token count: the wire
    # requires logprob_dispersion <= dispersion_tokens, which rounding must not break.
    return [
        dataclasses.replace(
            s,
            logprob_dispersion=min(
                float(dispersion[starts[i] : starts[i + 1]].sum()), float(lengths[i])
            ),
            dispersion_tokens=int(lengths[i]),
        )
        if compared[i]
        else s
        for i, s in enumerate(statistics)
    ]


def eos_score_gaps(
    arrays: Sequence[npt.NDArray[Any]],
    ids: npt.NDArray[np.int64],
    seed_rows: npt.NDArray[np.int64],
    positions: npt.NDArray[np.int64],
    temperature: float,
    eos_token_ids: Collection[int],
) -> npt.NDArray[np.float64]:
    """Per stacked row: the best EOS id's seeded Gumbel score minus the chosen token's (score
    units; NaN where the chosen token is EOS or no EOS ids are given). Reads only the chosen
    and EOS columns of the logits."""
    total = int(ids.size)
    eos = np.asarray(sorted(eos_token_ids), dtype=np.int64)
    gaps = np.full(total, np.nan)
    if eos.size == 0 or total == 0:
        return gaps
    vocab = arrays[0].shape[1]
    if eos.min() < 0 or eos.max() >= vocab:
        raise ValueError("EOS token id out of the vocabulary")
    rows = np.flatnonzero(~np.isin(ids, eos))
    if rows.size == 0:
        return gaps
    offsets = np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(np.int64)
    owner = np.searchsorted(offsets, rows, side="right") - 1
    columns = np.concatenate([ids[rows, None], np.broadcast_to(eos, (rows.size, eos.size))], 1)
    values = np.empty(columns.shape, dtype=np.float64)
    for array_index in np.unique(owner).tolist():
        picked = owner == array_index
        local = rows[picked] - offsets[array_index]
        values[picked] = arrays[array_index][local[:, None], columns[picked]]
    with np.errstate(over="ignore", invalid="ignore"):
        scores = values / temperature
        scores += gumbel_noise_at(seed_rows[rows], positions[rows], columns)
        gaps[rows] = scores[:, 1:].max(axis=1) - scores[:, 0]
    return gaps


def _statistics(
    lengths: npt.NDArray[np.int64],
    margins: npt.NDArray[np.float64],
    tolerances: npt.NDArray[np.float64],
    excess: npt.NDArray[np.float64],
    variance: npt.NDArray[np.float64],
    eos_gaps: npt.NDArray[np.float64],
    chosen_eos: npt.NDArray[np.bool_],
) -> list[RolloutStatistics]:
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN margins count as neither
        ratio = margins / tolerances
        eos_ratio = eos_gaps / tolerances
    band_losses = (ratio >= -1.0) & (ratio < -NEAR_TIE_FLOOR)
    eos_losses = band_losses & chosen_eos
    # NaN gaps (a chosen EOS, no EOS ids) compare False: never a pass.
    eos_passes = (eos_ratio >= -1.0) & (eos_ratio < -NEAR_TIE_FLOOR) & ~band_losses
    losses = band_losses & ~eos_losses
    wins = (ratio > NEAR_TIE_FLOOR) & (ratio <= 1.0) & ~eos_passes

    def per_rollout(values: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        cumulative = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
        return np.asarray(cumulative[starts[1:]] - cumulative[starts[:-1]], dtype=np.float64)

    loss_counts, win_counts = per_rollout(losses), per_rollout(wins)
    eos_loss_counts, eos_pass_counts = per_rollout(eos_losses), per_rollout(eos_passes)
    excess_sums, variance_sums = per_rollout(excess), per_rollout(variance)
    return [
        RolloutStatistics(
            tokens=int(lengths[i]),
            near_tie_losses=int(loss_counts[i]),
            near_tie_wins=int(win_counts[i]),
            logprob_excess=float(excess_sums[i]),
            logprob_variance=float(variance_sums[i]),
            eos_near_tie_losses=int(eos_loss_counts[i]),
            eos_near_tie_passes=int(eos_pass_counts[i]),
        )
        for i in range(lengths.size)
    ]


# -- the per-node sequential tests ---------------------------------------------------------------


TESTS = ("near_tie", "logprob_high", "logprob_low", "eos", "dispersion")
"""The per-node sequential tests, by the name a flag records."""


@dataclass(frozen=True)
class StatisticsPolicy:
    """The per-node tests' parameters (one policy per network dtype)."""

    honest_loss_rate: float
    """``pi0``: the largest share of band events that are losses for an honest node (the
    calibrated honest rate with margin)."""
    alternative_loss_rate: float
    """``pi1``: the share the near-tie test is tuned to detect quickly."""
    logprob_drift: float
    """``theta``: the log-probability tests' tilt (drift per unit variance they are tuned to)."""
    min_tokens: int
    """No flag before a node has this many summarized tokens."""
    honest_eos_loss_rate: float = 0.002
    """``q0``: the largest share of EOS events that are EOS losses for an honest node. An EOS
    loss is a band loss whose token is EOS: the same numeric noise has to reach the band, so
    ``q0`` is bounded by the pooled band-loss calibration (EOS events alone are too rare)."""
    alternative_eos_loss_rate: float = 0.2
    """``q1``: the EOS test's alternative. A steerer takes EOS at (nearly) every EOS event
    (share ~0.9); 0.2 keeps the drift positive down to a steerer taking ~5 % of them."""
    honest_dispersion: float = 0.46
    """``mu0``: the largest mean per-token dispersion ``Y`` of an honest node (the calibrated
    worst honest variation, with a safety factor on the noise amplitude)."""
    alternative_dispersion: float = 0.7
    """``mu1``: the dispersion test's alternative."""
    false_flag_probability: float = 1e-6
    """``alpha``: at most this probability that an honest node is ever flagged within
    :attr:`horizon_tokens` of its tokens."""
    horizon_tokens: int = 10_000_000
    """``K``: the horizon of the guarantee (restart points: one per verdict, at most one per
    token)."""

    def __post_init__(self) -> None:
        if not 0 < self.honest_loss_rate < self.alternative_loss_rate < 1:
            raise ValueError("need 0 < honest_loss_rate < alternative_loss_rate < 1")
        if not 0 < self.honest_eos_loss_rate < self.alternative_eos_loss_rate < 1:
            raise ValueError("need 0 < honest_eos_loss_rate < alternative_eos_loss_rate < 1")
        if not 0 < self.honest_dispersion < self.alternative_dispersion < 1:
            raise ValueError("need 0 < honest_dispersion < alternative_dispersion < 1")
        if not self.logprob_drift > 0:
            raise ValueError("logprob_drift must be > 0")
        if not 0 < self.false_flag_probability < 1 or self.horizon_tokens < 1:
            raise ValueError("false_flag_probability in (0, 1) and horizon_tokens >= 1")
        if self.min_tokens < 0:
            raise ValueError("min_tokens must be >= 0")

    @property
    def flag_threshold(self) -> float:
        """``h = ln(K m / alpha)`` for the ``m`` = 5 CUSUMs (see the module docs)."""
        return math.log(self.horizon_tokens * len(TESTS) / self.false_flag_probability)


FLOAT32_POLICY = StatisticsPolicy(
    honest_loss_rate=0.002,
    alternative_loss_rate=0.05,
    logprob_drift=0.05,
    min_tokens=1000,
    honest_dispersion=0.1,
    alternative_dispersion=0.5,
)
"""For fp32 networks. Honest fp32 noise is ~1e-3 of the 1e-3 tolerance: no honest band loss was
measured, and an honest mean dispersion ``Y`` of at most ~0.01 (every attack measured: above 0.98)
(``bench/node_statistics.py``; docs/verification.md has the counts)."""

BFLOAT16_POLICY = StatisticsPolicy(
    honest_loss_rate=0.002,
    alternative_loss_rate=0.03,
    logprob_drift=0.05,
    min_tokens=1000,
)
"""For bf16 networks. The most negative honest bf16 margin measured is 0.05 tolerances, half the
band's floor, at T = 1 and 0.7 (``bench/node_statistics.py``): no honest band loss in ~7,700 band
events, so ``pi0`` bounds the honest loss share with margin; the alternative is the share that
steering and the cheap substitutes of the detection table produce (2-10%). Dispersion: the worst
honest variation measured (eager attention) has a mean ``Y`` of 0.24, 0.45 at twice its noise
amplitude, which ``mu0`` bounds; int8 weights and an fp8 KV cache reach 0.62-0.64."""


def policy_for(dtype: str) -> StatisticsPolicy:
    """The per-node test policy for a network compute dtype name."""
    table = {
        "float32": FLOAT32_POLICY,
        "fp32": FLOAT32_POLICY,
        "bfloat16": BFLOAT16_POLICY,
        "bf16": BFLOAT16_POLICY,
    }
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"no per-node statistics policy for dtype {dtype!r}") from None


@dataclass(frozen=True)
class NodeEvidence:
    """A node's running sums and the five CUSUMs (what the coordinator stores per node)."""

    tokens: int = 0
    near_tie_losses: int = 0
    near_tie_wins: int = 0
    logprob_excess: float = 0.0
    logprob_variance: float = 0.0
    eos_near_tie_losses: int = 0
    eos_near_tie_passes: int = 0
    near_tie_cusum: float = 0.0
    """CUSUM of the near-tie test's log-likelihood ratio (H1 ``pi1`` vs H0 ``pi0``)."""
    logprob_high_cusum: float = 0.0
    """CUSUM of the log-probability test for a positive drift (a too-sharp sampler)."""
    logprob_low_cusum: float = 0.0
    """CUSUM of the log-probability test for a negative drift (unlikely tokens chosen)."""
    eos_cusum: float = 0.0
    """CUSUM of the EOS test's log-likelihood ratio (H1 ``q1`` vs H0 ``q0``)."""
    logprob_dispersion: float = 0.0
    dispersion_tokens: int = 0
    dispersion_cusum: float = 0.0
    """CUSUM of the dispersion test's log-likelihood ratio (H1 ``mu1`` vs H0 ``mu0``)."""

    def add(
        self, statistics: Sequence[RolloutStatistics], policy: StatisticsPolicy
    ) -> NodeEvidence:
        """The evidence after one verdict's rollouts (one CUSUM update per verdict)."""
        tokens = sum(s.tokens for s in statistics)
        losses = sum(s.near_tie_losses for s in statistics)
        wins = sum(s.near_tie_wins for s in statistics)
        eos_losses = sum(s.eos_near_tie_losses for s in statistics)
        eos_passes = sum(s.eos_near_tie_passes for s in statistics)
        excess = math.fsum(s.logprob_excess for s in statistics)
        variance = math.fsum(s.logprob_variance for s in statistics)
        dispersion = math.fsum(s.logprob_dispersion for s in statistics)
        compared = sum(s.dispersion_tokens for s in statistics)
        counts = (tokens, losses, wins, eos_losses, eos_passes, compared)
        if min(counts) < 0 or losses + wins + eos_losses + eos_passes > tokens or variance < 0:
            raise ValueError("statistics out of range")
        if not (math.isfinite(excess) and math.isfinite(variance) and math.isfinite(dispersion)):
            raise ValueError("statistics must be finite")
        if not all(
            0 <= s.logprob_dispersion <= s.dispersion_tokens <= s.tokens for s in statistics
        ):
            raise ValueError("need 0 <= logprob_dispersion <= dispersion_tokens <= tokens")
        pi0, pi1 = policy.honest_loss_rate, policy.alternative_loss_rate
        q0, q1 = policy.honest_eos_loss_rate, policy.alternative_eos_loss_rate
        near_tie_llr = losses * math.log(pi1 / pi0) + wins * math.log((1 - pi1) / (1 - pi0))
        eos_llr = eos_losses * math.log(q1 / q0) + eos_passes * math.log((1 - q1) / (1 - q0))
        mu0, mu1 = policy.honest_dispersion, policy.alternative_dispersion
        dispersion_llr = dispersion * math.log(mu1 / mu0) + (compared - dispersion) * math.log(
            (1 - mu1) / (1 - mu0)
        )
        theta = policy.logprob_drift
        tilt = theta * theta * variance / 2
        return NodeEvidence(
            tokens=self.tokens + tokens,
            near_tie_losses=self.near_tie_losses + losses,
            near_tie_wins=self.near_tie_wins + wins,
            logprob_excess=self.logprob_excess + excess,
            logprob_variance=self.logprob_variance + variance,
            eos_near_tie_losses=self.eos_near_tie_losses + eos_losses,
            eos_near_tie_passes=self.eos_near_tie_passes + eos_passes,
            near_tie_cusum=max(0.0, self.near_tie_cusum + near_tie_llr),
            logprob_high_cusum=max(0.0, self.logprob_high_cusum + theta * excess - tilt),
            logprob_low_cusum=max(0.0, self.logprob_low_cusum - theta * excess - tilt),
            eos_cusum=max(0.0, self.eos_cusum + eos_llr),
            logprob_dispersion=self.logprob_dispersion + dispersion,
            dispersion_tokens=self.dispersion_tokens + compared,
            dispersion_cusum=max(0.0, self.dispersion_cusum + dispersion_llr),
        )


@dataclass(frozen=True)
class NodeJudgement:
    """Whether a node's evidence flags it, and which test did."""

    flagged: bool
    test: str
    """One of :data:`TESTS`, or empty when not flagged."""
    statistic: float
    """The largest CUSUM (nats); the flag threshold is the policy's ``flag_threshold``."""


def judge(evidence: NodeEvidence, policy: StatisticsPolicy) -> NodeJudgement:
    """Flag the node when a CUSUM reaches ``policy.flag_threshold`` after ``min_tokens``."""
    cusums = {
        "near_tie": evidence.near_tie_cusum,
        "logprob_high": evidence.logprob_high_cusum,
        "logprob_low": evidence.logprob_low_cusum,
        "eos": evidence.eos_cusum,
        "dispersion": evidence.dispersion_cusum,
    }
    test, statistic = max(cusums.items(), key=lambda item: item[1])
    flagged = evidence.tokens >= policy.min_tokens and statistic >= policy.flag_threshold
    return NodeJudgement(flagged, test if flagged else "", statistic)
