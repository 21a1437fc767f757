"""Sandbox configuration: one frozen value, parsed and validated from strings.

`SandboxConfig.from_options(...)` is what the CLI (`python -m pipedrive_sandbox`, and the project's
`migrate sandbox`) calls; every bad option raises `ValueError` naming the option and the value.

Syntax of the two compact options:

* latency: ``none`` | ``realistic`` | ``realistic:<factor>`` (e.g. ``realistic:0.1`` = a tenth of the
  realistic delays). ``none`` adds no delay at all.
* faults: a comma list of ``kind:rate`` with kind in ``500``, ``502``, ``503``, ``slow``, ``drop``,
  ``badjson``, ``badrow`` and rate a probability in [0, 1], e.g. ``503:0.05,drop:0.01,badrow:0.002``.
  The request faults (all but ``badrow``) share one draw per request, so their rates must sum to <= 1.
  ``badrow`` is the share of generated rows that are malformed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

SCALES: tuple[str, ...] = ("tiny", "small", "seed-customer")
REQUEST_FAULT_KINDS: tuple[str, ...] = ("500", "502", "503", "slow", "drop", "badjson")
FAULT_KINDS: tuple[str, ...] = REQUEST_FAULT_KINDS + ("badrow",)
LATENCY_PROFILES: tuple[str, ...] = ("none", "realistic")
# Live account: the change operations and their default weights.
LIVE_OPS: tuple[str, ...] = ("create", "update", "delete", "archive", "unarchive", "merge", "mail", "product_remove", "file_replace",
                             "convert", "unlink", "rename_field", "relabel_option", "delete_field")
DEFAULT_LIVE_MIX = "create:3,update:6,delete:1,archive:1,unarchive:0.5,merge:0.5,mail:2"


@dataclass(frozen=True)
class LatencySpec:
    """A parsed latency option: a profile and a scale factor applied to its delays."""

    profile: str = "none"
    factor: float = 1.0

    @property
    def enabled(self) -> bool:
        """Whether any latency is added (a profile other than none, a positive factor)."""
        return self.profile != "none" and self.factor > 0

    def __str__(self) -> str:
        if self.profile == "none":
            return "none"
        return self.profile if self.factor == 1.0 else f"{self.profile}:{self.factor:g}"


@dataclass(frozen=True)
class FaultSpec:
    """Parsed fault rates, one per kind (0.0 = never)."""

    rates: tuple[tuple[str, float], ...] = ()

    def rate(self, kind: str) -> float:
        """The rate of fault `kind`, 0.0 when not configured."""
        for k, r in self.rates:
            if k == kind:
                return r
        return 0.0

    @property
    def request_rates(self) -> tuple[tuple[str, float], ...]:
        """Request-level faults in a fixed order (the order cumulative draws use)."""
        return tuple((k, self.rate(k)) for k in REQUEST_FAULT_KINDS if self.rate(k) > 0)

    def __str__(self) -> str:
        return ",".join(f"{k}:{r:g}" for k, r in self.rates)


def parse_latency(value: str | LatencySpec | None) -> LatencySpec:
    """Parse ``none`` | ``realistic`` | ``realistic:<factor>``."""
    if isinstance(value, LatencySpec):
        return value
    text = ("none" if value is None else str(value)).strip().lower()
    if text in ("", "none", "0"):
        return LatencySpec("none", 1.0)
    profile, sep, factor_text = text.partition(":")
    if profile not in LATENCY_PROFILES:
        raise ValueError(
            f"invalid latency {value!r}: profile must be one of {', '.join(LATENCY_PROFILES)}"
            " (optionally 'realistic:<factor>')"
        )
    factor = 1.0
    if sep:
        try:
            factor = float(factor_text)
        except ValueError:
            raise ValueError(f"invalid latency {value!r}: factor {factor_text!r} is not a number") from None
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"invalid latency {value!r}: factor must be a finite number >= 0")
    if profile == "none":
        return LatencySpec("none", 1.0)
    return LatencySpec(profile, factor)


def parse_faults(value: str | FaultSpec | None) -> FaultSpec:
    """Parse a comma list of ``kind:rate``."""
    if isinstance(value, FaultSpec):
        return value
    text = (value or "").strip()
    if not text or text.lower() == "none":
        return FaultSpec(())
    rates: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        kind, sep, rate_text = part.partition(":")
        kind = kind.strip().lower()
        if kind not in FAULT_KINDS:
            raise ValueError(
                f"invalid faults {value!r}: unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})"
            )
        if not sep:
            raise ValueError(f"invalid faults {value!r}: {part!r} must be 'kind:rate', e.g. '{kind}:0.05'")
        try:
            rate = float(rate_text)
        except ValueError:
            raise ValueError(f"invalid faults {value!r}: rate {rate_text!r} of {kind!r} is not a number") from None
        if not (0.0 <= rate <= 1.0):
            raise ValueError(f"invalid faults {value!r}: rate of {kind!r} must be within [0, 1], got {rate_text}")
        if kind in rates:
            raise ValueError(f"invalid faults {value!r}: fault kind {kind!r} given twice")
        rates[kind] = rate
    total = sum(r for k, r in rates.items() if k in REQUEST_FAULT_KINDS)
    if total > 1.0 + 1e-9:
        raise ValueError(f"invalid faults {value!r}: request fault rates sum to {total:g} > 1")
    return FaultSpec(tuple((k, rates[k]) for k in FAULT_KINDS if k in rates))


def parse_live_mix(value: str | None) -> tuple[tuple[str, float], ...]:
    """Parse the live mode's op weights, a comma list of ``op:weight`` (``""`` = DEFAULT_LIVE_MIX).

    Ops: create, update, delete, archive, unarchive, merge, mail, product_remove, file_replace, convert,
    unlink, rename_field, relabel_option, delete_field (the last seven weigh 0 in the default); weights are finite numbers >= 0
    summing to > 0. Returns (op, weight) pairs in LIVE_OPS order (missing ops weigh 0).
    Raises ValueError naming the option and the bad part.
    """
    text = (value or "").strip() or DEFAULT_LIVE_MIX
    weights: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        op, sep, weight_text = part.partition(":")
        op = op.strip().lower()
        if op not in LIVE_OPS:
            raise ValueError(f"invalid live_mix {value!r}: unknown op {op!r} (ops: {', '.join(LIVE_OPS)})")
        if not sep:
            raise ValueError(f"invalid live_mix {value!r}: {part!r} must be 'op:weight', e.g. '{op}:1'")
        try:
            weight = float(weight_text)
        except ValueError:
            raise ValueError(f"invalid live_mix {value!r}: weight {weight_text!r} of {op!r} is not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"invalid live_mix {value!r}: weight of {op!r} must be a finite number >= 0")
        if op in weights:
            raise ValueError(f"invalid live_mix {value!r}: op {op!r} given twice")
        weights[op] = weight
    if sum(weights.values()) <= 0:
        raise ValueError(f"invalid live_mix {value!r}: the weights must sum to > 0")
    return tuple((op, weights.get(op, 0.0)) for op in LIVE_OPS)


def _int_option(name: str, value: Any, *, minimum: int | None = None, allow_none: bool = False) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "unlimited")):
        if allow_none:
            return None
        raise ValueError(f"invalid {name} {value!r}: an integer is required")
    if isinstance(value, bool):
        raise ValueError(f"invalid {name} {value!r}: an integer is required")
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"invalid {name} {value!r}: not an integer") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"invalid {name} {value!r}: must be >= {minimum}")
    return number


def _bool_option(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = "" if value is None else str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off", "none"):
        return False
    raise ValueError(f"invalid {name} {value!r}: true or false is required")


def _float_option(name: str, value: Any, *, minimum_exclusive: float | None = None) -> float:
    if isinstance(value, bool):
        raise ValueError(f"invalid {name} {value!r}: a number is required")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"invalid {name} {value!r}: not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"invalid {name} {value!r}: must be finite")
    if minimum_exclusive is not None and number <= minimum_exclusive:
        raise ValueError(f"invalid {name} {value!r}: must be > {minimum_exclusive:g}")
    return number


def _live_rate(value: Any) -> float:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return 0.0
    number = _float_option("live_rate", value)
    if number < 0:
        raise ValueError(f"invalid live_rate {value!r}: must be >= 0 (changes per second, 0 = off)")
    return number


def _live_mix_text(value: Any) -> str:
    text = "" if value is None else str(value).strip()
    parse_live_mix(text)
    return text


@dataclass(frozen=True)
class SandboxConfig:
    """Everything that shapes one sandbox: data (scale, seed), auth, limits, latency and faults."""

    scale: str = "tiny"
    seed: int = 1
    token: str = field(default="sandbox-token", repr=False)
    latency: str = "none"
    faults: str = ""
    burst_limit: int = 80
    daily_budget: int | None = None
    day_seconds: float = 86400.0
    big_deal_messages: int | None = None
    page_limit_max: int = 500
    slow_seconds: float = 30.0
    burst_window_seconds: float = 2.0
    # API shapes: all off by default; README "Shapes" says what each one serves.
    page_cap: int = 0
    empty_pages: bool = False
    null_update_time: int = 0
    archive_flip: int = 0
    hostile_mail: bool = False
    private_mail: int = 0
    forbidden_fanout: int = 0
    private_deal_mail: int = 0
    long_notes: int = 0
    # Live account: off by default; README "Live account" says what changes and how.
    live_rate: float = 0.0
    live_max: int = 0
    live_mix: str = ""
    latency_spec: LatencySpec = field(init=False, repr=False, compare=False)
    fault_spec: FaultSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"invalid scale {self.scale!r}: must be one of {', '.join(SCALES)}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"invalid seed {self.seed!r}: an integer is required")
        if not isinstance(self.token, str) or not self.token or any(c.isspace() for c in self.token):
            raise ValueError("invalid token: a non-empty string without whitespace is required")
        if self.burst_limit < 1:
            raise ValueError(f"invalid burst_limit {self.burst_limit!r}: must be >= 1")
        if self.daily_budget is not None and self.daily_budget < 0:
            raise ValueError(f"invalid daily_budget {self.daily_budget!r}: must be >= 0 or None (unlimited)")
        if not self.day_seconds > 0:
            raise ValueError(f"invalid day_seconds {self.day_seconds!r}: must be > 0")
        if self.big_deal_messages is not None and self.big_deal_messages < 0:
            raise ValueError(f"invalid big_deal_messages {self.big_deal_messages!r}: must be >= 0")
        if self.page_limit_max < 1:
            raise ValueError(f"invalid page_limit_max {self.page_limit_max!r}: must be >= 1")
        if not self.slow_seconds > 0:
            raise ValueError(f"invalid slow_seconds {self.slow_seconds!r}: must be > 0")
        if not self.burst_window_seconds > 0:
            raise ValueError(f"invalid burst_window_seconds {self.burst_window_seconds!r}: must be > 0")
        for name in ("page_cap", "null_update_time", "archive_flip", "private_mail", "forbidden_fanout", "private_deal_mail", "long_notes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"invalid {name} {value!r}: an integer >= 0 is required (0 = off)")
        for name in ("empty_pages", "hostile_mail"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"invalid {name} {getattr(self, name)!r}: true or false is required")
        if isinstance(self.live_rate, bool) or not isinstance(self.live_rate, (int, float)) or not math.isfinite(self.live_rate) or self.live_rate < 0:
            raise ValueError(f"invalid live_rate {self.live_rate!r}: a finite number >= 0 is required (changes per second, 0 = off)")
        if not isinstance(self.live_max, int) or isinstance(self.live_max, bool) or self.live_max < 0:
            raise ValueError(f"invalid live_max {self.live_max!r}: an integer >= 0 is required (0 = no cap)")
        if not isinstance(self.live_mix, str):
            raise ValueError(f"invalid live_mix {self.live_mix!r}: a string 'op:weight,...' is required")
        parse_live_mix(self.live_mix)
        object.__setattr__(self, "live_rate", float(self.live_rate))
        object.__setattr__(self, "live_mix", self.live_mix.strip())
        object.__setattr__(self, "latency_spec", parse_latency(self.latency))
        object.__setattr__(self, "fault_spec", parse_faults(self.faults))
        # Normalised text forms, so equal configs compare equal.
        object.__setattr__(self, "latency", str(self.latency_spec))
        object.__setattr__(self, "faults", str(self.fault_spec))

    @classmethod
    def from_options(
        cls,
        scale: str = "tiny",
        seed: int | str = 1,
        token: str = "sandbox-token",
        latency: str | None = "none",
        faults: str | None = "",
        burst_limit: int | str = 80,
        daily_budget: int | str | None = None,
        day_seconds: float | str = 86400.0,
        big_deal_messages: int | str | None = None,
        page_limit_max: int | str = 500,
        slow_seconds: float | str = 30.0,
        burst_window_seconds: float | str = 2.0,
        page_cap: int | str = 0,
        empty_pages: bool | str = False,
        null_update_time: int | str = 0,
        archive_flip: int | str = 0,
        hostile_mail: bool | str = False,
        private_mail: int | str = 0,
        forbidden_fanout: int | str = 0,
        private_deal_mail: int | str = 0,
        long_notes: int | str = 0,
        live_rate: float | str = 0.0,
        live_max: int | str = 0,
        live_mix: str | None = "",
    ) -> "SandboxConfig":
        """Build a config from (possibly string) options; ValueError names any bad option and value."""
        scale_text = str(scale).strip().lower()
        if scale_text not in SCALES:
            raise ValueError(f"invalid scale {scale!r}: must be one of {', '.join(SCALES)}")
        token_text = "" if token is None else str(token)
        if not token_text.strip() or any(c.isspace() for c in token_text):
            raise ValueError("invalid token: a non-empty string without whitespace is required")
        return cls(
            scale=scale_text,
            seed=_int_option("seed", seed),  # type: ignore[arg-type]
            token=token_text,
            latency=str(parse_latency(latency)),
            faults=str(parse_faults(faults)),
            burst_limit=_int_option("burst_limit", burst_limit, minimum=1),  # type: ignore[arg-type]
            daily_budget=_int_option("daily_budget", daily_budget, minimum=0, allow_none=True),
            day_seconds=_float_option("day_seconds", day_seconds, minimum_exclusive=0.0),
            big_deal_messages=_int_option("big_deal_messages", big_deal_messages, minimum=0, allow_none=True),
            page_limit_max=_int_option("page_limit_max", page_limit_max, minimum=1),  # type: ignore[arg-type]
            slow_seconds=_float_option("slow_seconds", slow_seconds, minimum_exclusive=0.0),
            burst_window_seconds=_float_option("burst_window_seconds", burst_window_seconds, minimum_exclusive=0.0),
            page_cap=_int_option("page_cap", page_cap, minimum=0),  # type: ignore[arg-type]
            empty_pages=_bool_option("empty_pages", empty_pages),
            null_update_time=_int_option("null_update_time", null_update_time, minimum=0),  # type: ignore[arg-type]
            archive_flip=_int_option("archive_flip", archive_flip, minimum=0),  # type: ignore[arg-type]
            hostile_mail=_bool_option("hostile_mail", hostile_mail),
            private_mail=_int_option("private_mail", private_mail, minimum=0),  # type: ignore[arg-type]
            forbidden_fanout=_int_option("forbidden_fanout", forbidden_fanout, minimum=0),  # type: ignore[arg-type]
            private_deal_mail=_int_option("private_deal_mail", private_deal_mail, minimum=0),  # type: ignore[arg-type]
            long_notes=_int_option("long_notes", long_notes, minimum=0),  # type: ignore[arg-type]
            live_rate=_live_rate(live_rate),
            live_max=_int_option("live_max", live_max, minimum=0),  # type: ignore[arg-type]
            live_mix=_live_mix_text(live_mix),
        )

    RUNTIME_CHANGEABLE: ClassVar[tuple[str, ...]] = (
        "faults",
        "latency",
        "daily_budget",
        "burst_limit",
        "day_seconds",
        "slow_seconds",
        "page_limit_max",
        "burst_window_seconds",
        "token",  # a rotation: the old token stops working, the new one reaches the same company
        # Shapes: changing any of them rebuilds the shape state (archive flips start over).
        "page_cap",
        "empty_pages",
        "null_update_time",
        "archive_flip",
        "hostile_mail",
        "private_mail",
        "forbidden_fanout",
        "private_deal_mail",
        "long_notes",
        # Live account: a new rate restarts the background changes from now (0 stops them).
        "live_rate",
        "live_max",
        "live_mix",
    )
    LIVE: ClassVar[tuple[str, ...]] = ("live_rate", "live_max", "live_mix")
    SHAPES: ClassVar[tuple[str, ...]] = ("page_cap", "empty_pages", "null_update_time", "archive_flip", "hostile_mail", "private_mail",
                                         "forbidden_fanout", "private_deal_mail", "long_notes")

    def with_changes(self, changes: Mapping[str, Any]) -> "SandboxConfig":
        """A copy with runtime-changeable options replaced (validated like from_options)."""
        unknown = sorted(set(changes) - set(self.RUNTIME_CHANGEABLE))
        if unknown:
            raise ValueError(
                f"invalid config change {', '.join(unknown)}: only {', '.join(self.RUNTIME_CHANGEABLE)} can change at run time"
            )
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        options.update(changes)
        return SandboxConfig.from_options(**options)

    def to_cli_args(self) -> list[str]:
        """The `python -m pipedrive_sandbox` arguments that rebuild this config."""
        args = [
            "--scale", self.scale,
            "--seed", str(self.seed),
            "--token", self.token,
            "--latency", self.latency,
            "--faults", self.faults or "none",
            "--burst-limit", str(self.burst_limit),
            "--daily-budget", "none" if self.daily_budget is None else str(self.daily_budget),
            "--day-seconds", repr(self.day_seconds),
            "--page-limit-max", str(self.page_limit_max),
            "--slow-seconds", repr(self.slow_seconds),
            "--burst-window-seconds", repr(self.burst_window_seconds),
        ]
        if self.big_deal_messages is not None:
            args += ["--big-deal-messages", str(self.big_deal_messages)]
        # Shapes only when on: a default config gives the shortest command line.
        for name in ("page_cap", "null_update_time", "archive_flip", "private_mail", "forbidden_fanout", "private_deal_mail", "long_notes"):
            if getattr(self, name):
                args += ["--" + name.replace("_", "-"), str(getattr(self, name))]
        for name in ("empty_pages", "hostile_mail"):
            if getattr(self, name):
                args.append("--" + name.replace("_", "-"))
        # Live mode only when on, likewise.
        if self.live_rate:
            args += ["--live", repr(self.live_rate)]
        if self.live_max:
            args += ["--live-max", str(self.live_max)]
        if self.live_mix:
            args += ["--live-mix", self.live_mix]
        return args

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-able values, without the token."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.init and f.name != "token"
        }
