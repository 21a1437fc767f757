"""What the Pipedrive provider is configured with: where the source is, the token, the run options.

Configuration comes from the environment: `PIPEDRIVE_BASE_URL` (a run's `base_url` option serves
where it is not set - tests and benches against the sandbox - and is refused where it disagrees with
it: the workers reach the deployment's source) and `PIPEDRIVE_API_TOKEN`. A missing variable fails
at start-up (`PipedriveProvider.account()`, which starting a run calls) with the variable's name.
The token is held in memory only: it is not in run options, the database, logs, exceptions or
`repr()`. The account key the rate-limit budget is shared on is the host and a short one-way
fingerprint of the token (two tenants importing one account share its budget; the token cannot be
recovered from it). What a run's data belongs to is the company the token reaches
(`PipedriveProvider.identity()`, `/v1/users/me`): the engine records it and refuses workers that
reach another company, while a rotated token of the same company (another account key) carries on.

Run options: `base_url`, `burst_limit` (the plan's burst limit per 2 s; `PIPEDRIVE_BURST_LIMIT`,
default 80 - lowered automatically when the source's headers report less), `fetch_threads` (body
fetches in flight per email task, default 4, at most 64), `snapshot_margin_seconds` (default 300, at most a year),
`detect_deletes` (a sync's, default true: false lists only rows updated since, no deletions).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from engine_core.config import shown_url
from engine_core.errors import ConfigError
from engine_core.providers.pipedrive.emails import FETCH_THREADS

ENV_BASE_URL = "PIPEDRIVE_BASE_URL"
ENV_TOKEN = "PIPEDRIVE_API_TOKEN"
ENV_BURST_LIMIT = "PIPEDRIVE_BURST_LIMIT"
DEFAULT_BURST_LIMIT = 80
# Mail fetches at once per email task (`fetch_threads`): each is a thread, and the burst window
# (120 per 2 s at most on Pipedrive's plans) cannot feed more; a typo's 4000 would start 4000 threads.
MAX_FETCH_THREADS = 64
# The plans' largest burst limit is 120 per 2 s (480 with OAuth; shared/pipedrive-openapi) and the
# source's headers lower a larger one anyway; a sandbox serves any (tests and benches run at 100,000
# and 1,000,000). Beyond this the budget's row (an integer column) refused 1e20 in every task.
MAX_BURST_LIMIT = 1_000_000
SECRET_OPTIONS = ("token", "api_token", "pipedrive_api_token", "apitoken")


@dataclass(frozen=True)
class SourceConfig:
    """Where the source is and how to reach it; the token never leaves this object."""

    base_url: str
    token: str = field(repr=False)
    burst_limit: int = DEFAULT_BURST_LIMIT
    fetch_threads: int = FETCH_THREADS

    @property
    def account(self) -> str:
        """The rate-limit account: `<host>#<first 12 hex of the token's SHA-256>`. Pipedrive's
        limits are per token, so runs with one token share one budget; the token itself is never
        shown (a fingerprint, not the secret)."""
        host = urlsplit(self.base_url).netloc or self.base_url
        fingerprint = hashlib.sha256(self.token.encode()).hexdigest()[:12]
        return f"{host}#{fingerprint}"

    @classmethod
    def load(cls, options: Mapping[str, Any], env: Mapping[str, str], *, base_url: str | None = None, token: str | None = None) -> SourceConfig:
        """The source's configuration from a run's `options`, the environment `env` and what the
        caller passes (`base_url`, `token`: the deployment's, e.g. the Dagster resource's EnvVar
        values). The base URL is `base_url`, else PIPEDRIVE_BASE_URL, else the run's option
        `base_url`: a worker reaches the source its deployment is configured with, and a
        run's option that disagrees with it is refused before the run exists (`check_options`; else
        the run's workers would reach another company and every one would stop with
        SourceMismatch). The token is `token`, else PIPEDRIVE_API_TOKEN, never an option. Raises
        ConfigError (one line naming where the bad value came from: the option or the variable)
        for a missing or malformed value."""
        for key in options:
            if key.lower() in SECRET_OPTIONS:
                raise ConfigError(f"the API token comes from {ENV_TOKEN}, never from run options (found option {key!r})")
        option = options.get("base_url")
        if option is not None and not isinstance(option, str):
            raise ConfigError(f"the option base_url must be an http(s) URL, got {option!r}")
        # the deployment's URL first (the caller's, else the variable), the run's option where it has none
        url, named = next(((u.strip(), n) for u, n in ((base_url, ENV_BASE_URL), (env.get(ENV_BASE_URL), ENV_BASE_URL),
                                                        (option, "the option base_url")) if u and u.strip()),
                          ("", ENV_BASE_URL))
        if not url:
            raise ConfigError(f"{ENV_BASE_URL} is not set (the Pipedrive API's base URL, e.g. https://api.pipedrive.com)")
        check_base_url(url, named)
        secret = (token if token is not None else env.get(ENV_TOKEN, "")).strip()
        if not secret:
            raise ConfigError(f"{ENV_TOKEN} is not set (the Pipedrive API token)")
        if any(c.isspace() for c in secret):
            raise ConfigError(f"{ENV_TOKEN} must not contain whitespace")
        burst_from = "burst_limit" if "burst_limit" in options else ENV_BURST_LIMIT  # named where it came from
        burst = _positive(options.get("burst_limit", env.get(ENV_BURST_LIMIT) or DEFAULT_BURST_LIMIT), burst_from, minimum=2,
                          maximum=MAX_BURST_LIMIT)
        threads = _positive(options.get("fetch_threads", FETCH_THREADS), "fetch_threads", minimum=1,
                            maximum=MAX_FETCH_THREADS)
        return cls(url.rstrip("/"), secret, burst, threads)



# The run options a Pipedrive run takes (`migrate run --options`, the launchpad's `options_json`),
# each with what it means; anything else is refused before the run exists (`check_options`): a typo
# would be ignored silently, and a bad value stored with the run would fail every one of its tasks.
OPTIONS: dict[str, str] = {
    "base_url": f"the API's base URL where no {ENV_BASE_URL} is configured (refused when it disagrees with it)",
    "burst_limit": f"requests per 2 s burst window, 2 to {MAX_BURST_LIMIT:,} (default {ENV_BURST_LIMIT}, else {DEFAULT_BURST_LIMIT})",
    "fetch_threads": f"mail fetches at once per lane thread, 1 to {MAX_FETCH_THREADS}",
    "detect_deletes": "a sync lists every id to find deletions (true/false; default true)",
    "overwrite_matched": "a changed source row overwrites the product row it was matched to (true/false; default false)",
    "snapshot_margin_seconds": "seconds before the run's snapshot a sync lists from (>= 0; default 300)",
}
BOOLEAN_WORDS = ("1", "0", "true", "false", "yes", "no", "on", "off")


def check_base_url(url: str, named: str) -> None:
    """Refuse, with ConfigError naming `named` (the option or the variable), a base URL that is not
    http(s) or that carries a query or a fragment (a `...?api_token=...` URL would answer 404 to
    every task: the client appends paths to the base URL). Neither the query nor credentials are
    shown."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{named} must be an http(s) URL, got {shown_url(url)!r}")
    parts = urlsplit(url)
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ConfigError(f"{named} must be a base URL without a query or fragment, got {shown_url(url)!r}"
                          " followed by one")


def _positive(value: Any, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """`value` as an integer from `minimum` to `maximum`: an int, an integral float (4.0) or a
    string of digits ("4", from the environment). Raises ConfigError (one line naming `name`) for
    anything else: a boolean (int() reads true as 1), a fraction (int() cuts 1.5 to 1), NaN or
    Infinity (json reads both; 1e400 is read as inf: int() of them raises a traceback)."""
    if isinstance(value, bool) or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {number}")
    return number
