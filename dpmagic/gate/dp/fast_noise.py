"""Discrete Laplace noise for large vectors: OpenDP's distribution, vectorised.

OpenDP's sampler draws one value at a time in exact rational arithmetic
(about 10 µs each): a million released cells would take ten seconds. This
module draws the same distribution in batches with numpy, exactly and from
a cryptographically secure generator (OpenSSL's), by the algorithm OpenDP implements (Canonne,
Kamath and Steinke 2020, Algorithms 1-2):

- OpenDP takes the float ``scale`` as the exact rational it denotes; so do
  we: ``scale = t / s`` with ``t`` and ``s`` integers (``s`` a power of two).
- ``U`` uniform on ``{0..t-1}``, kept with probability ``exp(-U/t)``;
  ``V`` counts successes of ``Bernoulli(exp(-1))`` before the first failure;
  ``Y = floor((U + t·V) / s)``; a fair sign ``B``; ``(B, Y) = (1, 0)`` is
  rejected. The result ``(1 - 2B)·Y`` is discrete Laplace with scale ``t/s``.
- ``Bernoulli(exp(-γ))`` for rational ``γ = n/d`` in ``[0, 1]``: draw
  ``A_k ~ Bernoulli(γ/k)`` for ``k = 1, 2, …`` until one fails; succeed iff
  the failing ``k`` is odd. Each ``A_k`` compares a uniform integer below
  ``d·k`` with ``n``: integers only, no floating point anywhere. For ``γ = 1``
  (``V``'s trials) the failing ``k`` is read from one uniform integer below a
  multiple ``M`` of ``15!`` against the thresholds ``M/k!``
  (``_bernoulli_exp_one``): the same events, with the same probabilities, from one
  word instead of about three.
- Uniform integers below ``m`` come from 64 random bits, rejected below
  ``2**64 mod m`` so that the rest divides evenly (no modulo bias).

Every quantity stays below ``2**64`` in the vectorised loops because
``t < 2**TOP_BITS`` and they stop at ``STEPS``; the few slots still going
then (each with probability below ``1/STEPS!`` or ``exp(-STEPS)``) continue
the very same draw in Python integers, so nothing is truncated or redrawn
and the distribution stays exact. Scales outside this range go to OpenDP's
own sampler. ``tests/unit/test_fast_noise.py`` compares the two statistically.
"""

from __future__ import annotations

import math
import secrets
import ssl
from fractions import Fraction

import numpy as np

TOP_BITS = 56
STEPS = 128  # in numpy: t·k and U + t·V stay below 2**56 · 2**7 + 2**56 < 2**64
BLOCK = 4  # Bernoulli draws per slot per step in short vectors: most end in one block
BLOCKED_CELLS = 4_096
# Attempts per round: the values wanted over the acceptance rate (guessed at first,
# then the last round's), plus a few; any shortfall is another round.
FIRST_ACCEPTANCE = 0.55
MIN_ACCEPTANCE = 0.05
SPARE_TRIES = 16
_U64 = np.uint64
# The most multiples of 15! below 2**64 (a word is rejected with probability 2e-8;
# below 20! it was 8%), and the thresholds ROOM/k! for k = 15 … 2 (ascending): a
# uniform integer below ROOM is below ROOM/k! with probability 1/k!.
TABLE = 15
ROOM = 2**64 // math.factorial(TABLE) * math.factorial(TABLE)
ALL_SUCCEED = np.array([ROOM // math.factorial(k) for k in range(TABLE, 1, -1)], dtype=_U64)
# Draws below ROOM/5! (one in 120) count their successes by search; the rest by three
# comparisons.
COMPARED = 3
_WORDS: dict[int, type[np.unsignedinteger]] = {16: np.uint16, 32: np.uint32, 64: _U64}


def exact_scale(scale: float) -> tuple[int, int] | None:
    """``(t, s)`` with ``scale == t / s`` exactly, or None when ``t`` is too large for 64-bit
    arithmetic (then use OpenDP's sampler)."""
    ratio = Fraction(scale)
    t, s = ratio.numerator, ratio.denominator
    if not (0 < t < 2**TOP_BITS and s < 2**62):
        return None
    return t, s


def discrete_laplace(t: int, s: int, size: int) -> np.ndarray:
    """``size`` independent draws of discrete Laplace with scale ``t / s``, as int64.

    Attempts are independent, and an accepted attempt's value has the target
    distribution whatever the other attempts did; so each round makes more attempts
    than values still wanted and keeps the first accepted ones, in attempt order (a
    choice made from the acceptances alone). Most vectors are done in one round:
    the cost of a round is its loops' steps, not its length, and a round per
    rejection left took 2 ms for 1,000 cells."""
    out = np.empty(size, dtype=np.int64)
    done, rate = 0, FIRST_ACCEPTANCE
    while done < size:
        wanted = size - done
        tries = int(wanted / rate) + SPARE_TRIES
        values, ok = _attempt(t, s, tries)
        kept = values[ok][:wanted]
        out[done : done + kept.size] = kept
        done += kept.size
        rate = max(ok.mean(), MIN_ACCEPTANCE)
    return out


def _attempt(t: int, s: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One attempt per slot: the value, and whether the attempt was accepted."""
    # Short vectors draw a block of Bernoulli trials per slot and step (fewer steps,
    # each a few numpy calls); long ones one at a time (fewer random words).
    block = BLOCK if n <= BLOCKED_CELLS else 1
    u = _uniform(t, n)
    ok = _bernoulli_exp(u, t, block)
    v = np.zeros(n, dtype=_U64)
    idx = np.flatnonzero(ok)
    for _ in range(STEPS // block):  # V: successes of Bernoulli(exp(-1)) before the first failure
        if not idx.size:
            break
        trials = _bernoulli_exp_one(idx.size * block)
        if block == 1:  # a success counts and goes on, a failure ends the count
            idx = idx[trials]
            v[idx] += _U64(1)
            continue
        failed = ~trials.reshape(-1, block)
        ended = failed.any(axis=1)
        # The successes before the first failure; draws after it are discarded unseen.
        v[idx] += np.where(ended, failed.argmax(axis=1), block).astype(_U64)
        idx = idx[~ended]
    y = ((u + _U64(t) * v) // _U64(s)).astype(np.int64)
    for i in idx:  # V reached STEPS: go on counting, exactly
        count = int(v[i])
        while _scalar_bernoulli_exp(1, 1):
            count += 1
        y[i] = (int(u[i]) + t * count) // s  # beyond int64 only with probability < e**-2**62
    sign = _words(n, np.uint8) & np.uint8(1)
    ok &= ~((sign == 1) & (y == 0))
    return np.where(sign == 1, -y, y), ok


def _bernoulli_exp(num: np.ndarray, den: int, block: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for each numerator, ``num <= den < 2**TOP_BITS``: the
    ``A_k ~ Bernoulli(γ/k)`` of each slot still going are drawn ``block`` at a time
    (a uniform integer below ``den·k`` less than ``num``), and the first failing ``k``
    decides; draws after it are discarded unseen."""
    result = np.empty(num.size, dtype=bool)
    idx = np.arange(num.size)
    live = num  # the numerators of the slots still going, in ``idx``'s order
    k = 1
    while idx.size and k + block - 1 <= STEPS:
        if block == 1:  # one shared bound: the cheaper uniform; the draw that fails is k
            ended: np.ndarray = _uniform(den * k, idx.size) >= live
            result[idx[ended]] = k % 2 == 1
        else:
            bounds = _U64(den) * np.arange(k, k + block, dtype=_U64)
            draws = _uniform_each(np.tile(bounds, idx.size)).reshape(-1, block)
            failed = draws >= live[:, None]
            ended = np.asarray(failed.any(axis=1))
            first = k + failed[ended].argmax(axis=1)
            result[idx[ended]] = first % 2 == 1
        going = ~ended
        idx, live = idx[going], live[going]
        k += block
    for i in idx:  # k reached STEPS: the same draw, in Python integers
        result[i] = _scalar_bernoulli_exp(int(num[i]), den, k)
    return result


def _bernoulli_exp_one(n: int) -> np.ndarray:
    """``n`` draws of Bernoulli(exp(-1)): the trials ``A_k ~ Bernoulli(1/k)`` of
    ``_bernoulli_exp`` with ``γ = 1``, drawn together from one uniform integer ``R``
    below ``ROOM`` (a multiple of 15!) a slot. ``A_1`` always succeeds, and
    ``A_2 … A_k`` all succeed with probability ``1/k!``, which is exactly the
    probability that ``R < ROOM/k!`` (an integer for ``k <= 15``). So the first
    failing trial is the least ``k`` with ``R >= ROOM/k!``, and the draw succeeds iff
    it is odd: the same events with the same probabilities as ``_bernoulli_exp``
    (V's trials took two thirds of a draw's time there, nearly three uniform integers
    each). Where ``R`` is below every threshold (``A_2 … A_15`` all succeeded,
    probability ``1/15!``), the same draw goes on from ``A_16`` in Python integers."""
    draws = _uniform(ROOM, n)
    succeeded = np.zeros(n, dtype=np.intp)  # of A_2 … A_k, before the first failure
    for threshold in ALL_SUCCEED[: -COMPARED - 1 : -1]:
        succeeded += draws < threshold
    deep = np.flatnonzero(draws < ALL_SUCCEED[-COMPARED - 1])
    found = np.searchsorted(ALL_SUCCEED, draws[deep], side="right")
    succeeded[deep] = ALL_SUCCEED.size - found
    result = succeeded % 2 == 1  # the first failure is A_(succeeded + 2)
    for i in deep[found == 0]:
        result[i] = _scalar_bernoulli_exp(1, 1, ALL_SUCCEED.size + 2)
    return result


def _scalar_bernoulli_exp(num: int, den: int, k: int = 1) -> bool:
    while secrets.randbelow(den * k) < num:
        k += 1
    return k % 2 == 1


def _uniform(bound: int, n: int) -> np.ndarray:
    """``n`` uniform integers in ``[0, bound)``, without modulo bias, from words of the
    fewest of 16, 32 or 64 bits that hold ``bound`` (the trials of ``_bernoulli_exp``
    mostly compare with numbers below ``2**16``: a quarter of the random bytes)."""
    width = next(w for w in (16, 32) if bound < 2**w) if bound < 2**32 else 64
    kind = _WORDS[width]
    m = kind(bound)
    floor = kind(2**width % bound)  # below it, r % m would be biased
    out = _words(n, kind)
    bad = np.flatnonzero(out < floor)
    if bad.size:  # only then a writable copy
        out = out.copy()
    while bad.size:
        out[bad] = _words(bad.size, kind)
        bad = bad[out[bad] < floor]
    return out % m


def _uniform_each(bound: np.ndarray) -> np.ndarray:
    """Uniform integers in ``[0, bound[i])`` for each ``i``, without modulo bias."""
    floor = (np.zeros_like(bound) - bound) % bound  # 2**64 mod bound, by wrap-around
    out = _bits(bound.size)
    bad = np.flatnonzero(out < floor)
    while bad.size:
        out[bad] = _bits(bad.size)
        bad = bad[out[bad] < floor[bad]]
    return out % bound


def _bits(n: int) -> np.ndarray:
    """Random 64-bit words from OpenSSL's CSPRNG: secure, and three times the speed of
    urandom."""
    return _words(n, _U64).copy()


def _words(n: int, kind: type[np.unsignedinteger]) -> np.ndarray:
    """``n`` random words of ``kind``, read-only (over the bytes OpenSSL returned)."""
    return np.frombuffer(ssl.RAND_bytes(np.dtype(kind).itemsize * n), dtype=kind)
