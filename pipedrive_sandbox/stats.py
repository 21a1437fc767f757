"""What the sandbox counts about the traffic it serves (`GET /_sandbox/stats`)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stats:
    """Counters of the traffic one server answered, per endpoint template (`GET /_sandbox/stats`).

    Requests, tokens charged, status codes, 429s by limit (burst | daily), faults drawn, unauthorised
    requests, concurrency (current and peak, overall, per endpoint, and of mail-body fetches), body
    fetches per message id, and listings per (path, query): what the benches and tests measure a
    client by."""

    requests: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    status_codes: dict[str, Counter[str]] = field(default_factory=dict)
    rate_limited: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    unauthorized: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    in_flight_by: Counter[str] = field(default_factory=Counter)
    peak_in_flight_by: Counter[str] = field(default_factory=Counter)
    body_in_flight: int = 0
    peak_body_in_flight: int = 0
    bodies_fetched: Counter[int] = field(default_factory=Counter)
    listings: Counter[str] = field(default_factory=Counter)

    def enter(self, template: str, body: bool) -> None:
        """Count a request of `template` as in flight (and a body fetch, when `body`); track the peaks."""
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.in_flight_by[template] += 1
        self.peak_in_flight_by[template] = max(self.peak_in_flight_by[template], self.in_flight_by[template])
        if body:
            self.body_in_flight += 1
            self.peak_body_in_flight = max(self.peak_body_in_flight, self.body_in_flight)

    def leave(self, template: str, body: bool) -> None:
        """Count a request of `template` as finished (the pair of `enter`)."""
        self.in_flight -= 1
        self.in_flight_by[template] -= 1
        if body:
            self.body_in_flight -= 1

    def status(self, template: str, code: int) -> None:
        """Count one response of `template` with status `code` (0 for a dropped connection)."""
        self.status_codes.setdefault(template, Counter())[str(code)] += 1

    def to_json(self) -> dict[str, Any]:
        """The counters as the JSON body of `GET /_sandbox/stats` (without `daily` and `config`)."""
        return {
            "requests_total": sum(self.requests.values()),
            "tokens_total": sum(self.tokens.values()),
            "requests": dict(self.requests),
            "tokens": dict(self.tokens),
            "status_codes": {k: dict(v) for k, v in self.status_codes.items()},
            "rate_limited": {"burst": self.rate_limited["burst"], "daily": self.rate_limited["daily"]},
            "faults": dict(self.faults),
            "unauthorized": self.unauthorized,
            "in_flight": {
                "current": self.in_flight,
                "peak": self.peak_in_flight,
                "peak_by_endpoint": {k: v for k, v in self.peak_in_flight_by.items() if v},
                "body_fetches_current": self.body_in_flight,
                "body_fetches_peak": self.peak_body_in_flight,
            },
            "bodies_fetched": {str(k): v for k, v in sorted(self.bodies_fetched.items())},
            "listings": dict(self.listings),
        }
