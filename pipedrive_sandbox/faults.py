"""Deterministic request faults and latency.

Every decision is a pure function of (seed, method, path, sorted query without the token, n),
where n counts how many times this exact request key has been seen before (0 for the first). So
the same seed and the same sequence of requests give the same faults, whatever the thread timing,
and a retried request gets a fresh draw. The request faults share one uniform draw, cut into
consecutive intervals by their rates in the fixed order 500, 502, 503, slow, drop, badjson.

Latency (`realistic`): a lognormal delay around a per-endpoint median (listing 0.3 s, single GET
0.2 s, mail body fetch 1.0 s), sigma 0.35, plus a 2% tail of 3-6x; all multiplied by the factor.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterable

from .config import FaultSpec, LatencySpec

LATENCY_MEDIANS: dict[str, float] = {"list": 0.3, "single": 0.2, "body": 1.0}
LATENCY_SIGMA = 0.35
TAIL_RATE = 0.02


def request_key(method: str, path: str, query: Iterable[tuple[str, str]]) -> str:
    """The request identity used by faults and listings: token-free, query sorted."""
    items = sorted((k, v) for k, v in query if k != "api_token")
    qs = "&".join(f"{k}={v}" for k, v in items)
    return f"{method.upper()} {path}?{qs}" if qs else f"{method.upper()} {path}"


def _uniforms(seed: int, key: str, n: int, salt: str, count: int) -> list[float]:
    digest = hashlib.blake2b(f"{seed}|{salt}|{n}|{key}".encode("utf-8", "surrogatepass"), digest_size=8 * count).digest()
    return [(int.from_bytes(digest[8 * i : 8 * i + 8], "little") >> 11) / float(1 << 53) for i in range(count)]


@dataclass(frozen=True)
class FaultDecision:
    """What one request gets: a fault `kind` (None, or 500/502/503/drop/slow/badjson), `n` (how many
    times this same request was seen before) and its added `latency` in seconds."""

    kind: str | None
    n: int
    latency: float


@dataclass
class FaultPlan:
    """Deterministic faults and latency: a request's fate is drawn from (seed, request key, n), so the
    n-th repetition of the same request meets the same fault in every run with the same seed, and a
    retry (n + 1) draws afresh."""

    seed: int
    faults: FaultSpec
    latency: LatencySpec
    _seen: dict[bytes, int] = field(default_factory=dict)

    def reconfigure(self, faults: FaultSpec, latency: LatencySpec) -> None:
        """Take new fault rates and latency; new rates start every request's count over."""
        if faults != self.faults:
            self._seen.clear()  # a new fault plan restarts its sequence
        self.faults = faults
        self.latency = latency

    def decide(self, key: str, latency_class: str) -> FaultDecision:
        """The fault and latency of this repetition of request `key`, in latency class list | single | body."""
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        n = self._seen.get(digest, 0)
        self._seen[digest] = n + 1
        u_fault, u_lat, u_tail, u_tailsize = _uniforms(self.seed, key, n, "fault", 4)
        kind = None
        acc = 0.0
        for k, rate in self.faults.request_rates:
            acc += rate
            if u_fault < acc:
                kind = k
                break
        return FaultDecision(kind, n, self._latency(latency_class, u_lat, u_tail, u_tailsize))

    def _latency(self, latency_class: str, u: float, u_tail: float, u_size: float) -> float:
        if not self.latency.enabled:
            return 0.0
        median = LATENCY_MEDIANS.get(latency_class, 0.2)
        z = _normal_ppf(min(max(u, 1e-9), 1 - 1e-9))
        delay = median * math.exp(LATENCY_SIGMA * z)
        if u_tail < TAIL_RATE:
            delay *= 3.0 + 3.0 * u_size
        return delay * self.latency.factor


def _normal_ppf(p: float) -> float:
    """Inverse standard normal CDF (Acklam's approximation; plenty for jitter)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        q = math.sqrt(-2 * math.log(1 - p))
        return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
