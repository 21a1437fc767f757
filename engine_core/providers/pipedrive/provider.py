"""The Pipedrive provider (source "pipedrive"): a whole account into the product's CRM tables.

Phases are data (`plan.PHASES`): field definitions, users and pipelines; organizations and
stages; persons; deals and leads (archived ones from their own endpoints); activities; notes; then
every deal's email. Full history always: every list is walked from its start, never `/v1/recents`
(a month at most).

Tasks and cursors (details in `stripes.py`):

* `fields` - one task a run (`fields:all`): every field definition, stored in
  crm.custom_field_definitions so the product can show custom values by name and option label;
  the other tasks read them from there once per run.
* v1 kinds (users, leads, leads_archived, notes) - offset pages striped by page arithmetic: four
  stripes own spans of 500 from 0, 500, 1000, 1500 (500 seeded by the first page when the API
  says there is more, the others by span 500's first page); a page that reaches its span's end creates
  span + 4 x 500, a shorter page the API says is not the last goes on at its `next_start`.
* v2 kinds (organizations, persons, deals, deals_archived, activities) - cursor pages striped by
  ranges of `update_time`: a discovery task finds the oldest and newest update (walking past
  empty pages) and seeds four walkers over four equal spans (the first and last open-ended), plus
  one over the unfiltered list for rows whose `update_time` is null when there are any; each
  creates its next page - a list of fewer than `STRIPE_MIN_ROWS` rows has one walker instead, from
  the discovery's own first page (`discover`). The deal lists' discovery records the source's own
  count (`source_total`: the rows of a list its first page held, else `/v1/deals/summary`) in its
  task stats.
  Pipelines and stages (short v2 lists without time filters) have one walker each; a deal links to
  its pipeline and stage when they are here.
* `emails` - discovery walks the deal lists and seeds tasks of ten deals with mail; each task
  fetches bodies in rounds of four on four threads holding no database connection (`emails.py`).
* `catchup` - the last phase: a run records its snapshot moment (the source's `Date`,
  `source_time`); the v2 spans end at it, and the catch-up walks each kind's whole list once,
  parents first, writing what the ledger lacks or holds at an older version (a row that moved
  between spans, offsets or lists while the run walked; changes since), marking what a GET
  confirms deleted, and fetching mail for changed deals with more mail than the product holds
  (`inventory.py`). A sync (mode 'sync') seeds only the field definitions and its catch-up.
  `source_ids` is the same listing, for verify.

Configuration comes from the environment: `PIPEDRIVE_BASE_URL` (a run's `base_url` option serves
where it is not set - tests and benches against the sandbox - and is refused where it disagrees with
it: the workers reach the deployment's source) and `PIPEDRIVE_API_TOKEN`. A missing variable
fails at start-up (`account()`, which starting a run calls) with the variable's name. The token is
held in memory only: it is not in run options, the database, logs, exceptions or `repr()`. The
account key the rate-limit budget is shared on is the host and a short one-way fingerprint of the
token (two tenants importing one account share its budget; the token cannot be recovered from it).
What a run's data belongs to is the company the token reaches (`identity()`, `/v1/users/me`): the
engine records it and refuses workers that reach another company, while a rotated token of the same
company (another account key) carries on.

Run options: `base_url`, `burst_limit` (the plan's burst limit per 2 s; `PIPEDRIVE_BURST_LIMIT`,
default 80 - lowered automatically when the source's headers report less), `fetch_threads` (body
fetches in flight per email task, default 4, at most 64), `snapshot_margin_seconds` (default 300, at most a year),
`detect_deletes` (a sync's, default true: false lists only rows updated since, no deletions).
"""
from __future__ import annotations

import hashlib
import math
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from engine_core.budget import Budget
from engine_core.config import daily_token_share, shown_url
from engine_core.context import TaskContext
from engine_core.db import Database
from engine_core.errors import ConfigError
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.source import margin_option
from engine_core.target.files import store_from_env
from engine_core.providers.pipedrive import estimate as costs
from engine_core.providers.pipedrive import (contents, credentials, emails, inventory, kinds, lines, mapping,
                                             record_lists, stripes, writers)
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.prefetch import prefetch_store
from engine_core.providers.pipedrive.errors import BadResponse, NotFound
from engine_core.providers.pipedrive.fields import FieldBook
from engine_core.providers.pipedrive.mapping import MalformedRow
from engine_core.providers.pipedrive.stripes import STRIPE_MIN_ROWS, estimate_rows, first_time as _first_time  # noqa: F401 - the discovery's rules
from engine_core.providers.pipedrive.kinds import COUNTED, SUMMARY_PATHS, V1_FIELD_LISTS, V2_FIELD_LISTS
from engine_core.providers.pipedrive.plan import CATCHUP, DEPENDS_ON, PHASES

SOURCE = "pipedrive"
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
    fetch_threads: int = emails.FETCH_THREADS

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
        threads = _positive(options.get("fetch_threads", emails.FETCH_THREADS), "fetch_threads", minimum=1,
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


def check_options(options: Mapping[str, Any], env: Mapping[str, str], *, base_url: str | None = None,
                  token: str | None = None) -> None:
    """Refuse, with ConfigError (one line naming the option), a run option a Pipedrive run does
    not take (`OPTIONS`; a token among them is named as such) or a value the run would refuse
    later (`SourceConfig.load`, the booleans, `source.margin_option`, the file store's variables:
    `target.files.store_from_env`). Sends nothing."""
    if not isinstance(options, Mapping):
        raise ConfigError(f"run options must be a JSON object, got {type(options).__name__}")
    unknown = sorted(k for k in options if k not in OPTIONS and str(k).lower() not in SECRET_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for a "
                          f"pipedrive run; it takes: {', '.join(OPTIONS)}")
    cfg = SourceConfig.load(options, env, base_url=base_url, token=token)
    if options.get("base_url"):
        check_base_url(options["base_url"].strip(), "the option base_url")
        if cfg.base_url != options["base_url"].strip().rstrip("/"):
            raise ConfigError(f"the option base_url ({shown_url(options['base_url'])}) disagrees with "
                              f"{ENV_BASE_URL} ({shown_url(cfg.base_url)}), which this deployment's workers "
                              f"reach: set {ENV_BASE_URL} instead (the option is for where it is not set)")
    for name in ("detect_deletes", "overwrite_matched"):
        value = options.get(name)
        ok = (value is None or isinstance(value, bool) or value in (0, 1)
              or (isinstance(value, str) and value.strip().lower() in BOOLEAN_WORDS))
        if not ok:
            raise ConfigError(f"{name} must be true or false, got {value!r}")
    margin_option(options)
    store_from_env(dict(env))  # the file store's variables (MIGRATE_FILE_STORE, MIGRATE_FILE_MAX_BYTES), named when bad


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


# The run's field definitions, shared by every provider instance of this process: read once per
# run (a dry run stores nothing, so this is where its later phases find them).
_books: OrderedDict[tuple[str, int], FieldBook] = OrderedDict()
_books_lock = threading.Lock()
BOOKS_KEPT = 32


def _remember_book(ctx: TaskContext, book: FieldBook) -> None:
    key = (ctx.db.url, ctx.run.id)
    with _books_lock:
        _books[key] = book
        _books.move_to_end(key)
        while len(_books) > BOOKS_KEPT:
            _books.popitem(last=False)


def _recall_book(ctx: TaskContext) -> FieldBook | None:
    with _books_lock:
        return _books.get((ctx.db.url, ctx.run.id))


_loaders: dict[tuple[str, int], threading.Lock] = {}


def _book_loader(ctx: TaskContext) -> threading.Lock:
    """The lock one lane holds while it reads the run's field definitions (`PipedriveProvider.book`)."""
    with _books_lock:
        lock = _loaders.get((ctx.db.url, ctx.run.id))
        if lock is None:
            if len(_loaders) > BOOKS_KEPT:
                _loaders.clear()  # unheld ones only matter while a run's first pages load
            lock = _loaders[(ctx.db.url, ctx.run.id)] = threading.Lock()
        return lock


# One budget per (database, account) in a process: every lane thread leases from the same chunks.
_budgets: weakref.WeakKeyDictionary[Database, dict[str, Budget]] = weakref.WeakKeyDictionary()
_budgets_lock = threading.Lock()


def budget_for(db: Database, account: str, burst_limit: int) -> Budget:
    """The process's one `Budget` for `account` in `db` (made again when `burst_limit`, requests
    per burst window, changed), so every lane thread paces against the same limits."""
    with _budgets_lock:
        per_db = _budgets.setdefault(db, {})
        budget = per_db.get(account)
        if budget is None or budget.burst_limit != burst_limit:
            budget = per_db[account] = Budget(db, SOURCE, account, burst_limit=burst_limit)
        return budget


# The company a (base URL, token) reaches, as `/v1/users/me` said (`identity`): a Pipedrive token
# belongs to one user of one company for its whole life, so the process asks once per base URL and
# account (the token's fingerprint) - the run's start, its lanes and later runs alike. A few are kept.
IDENTITIES_KEPT = 32
# The `Date` of the identity's answer stands for the source's clock (`source_time`) this long after.
CLOCK_FRESH_SECONDS = 5.0
_identities: OrderedDict[tuple[str, str], str] = OrderedDict()
_identities_lock = threading.Lock()
_asking_identity: dict[tuple[str, str], threading.Lock] = {}


def _ask_identity(cfg: SourceConfig) -> tuple[str, datetime | None]:
    """(the company's identity, the source's clock when it answered) from one unpaced `/v1/users/me`."""
    with PipedriveClient(cfg.base_url, cfg.token) as client:
        me = client.me()
    return f"pipedrive company {me['company_id']}", _http_date(me.get("_date"))


def _http_date(raw: str | None) -> datetime | None:
    """An HTTP `Date` header as an aware datetime (UTC when it names no zone); None when absent or unreadable."""
    if not raw:
        return None
    try:
        moment = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def kinds_module_default() -> list[kinds.Kind]:
    """The kinds a run takes by default (every kind but the opt-in ones), in declaration order."""
    return [k for k in kinds.KINDS if k.default]


def snapshot_bound(run: Run) -> str | None:
    """`updated_until` of a full run's v2 spans: the run's snapshot, whole seconds,
    exclusive - what changed after it is the catch-up phase's. None for a run from before snapshots."""
    return stripes.rfc3339(run.snapshot_at) if run.snapshot_at is not None else None


class PipedriveProvider:
    """The engine's provider for Pipedrive (module docstring): a run's kinds and phases, its
    tasks' seeds and their work against the source. Reads its configuration (base URL, token)
    lazily from the run's options and the environment; the token stays out of its repr."""

    source = SOURCE
    ledger_kind = staticmethod(kinds.ledger_kind)  # archived deals/leads share their kind's identities
    catchup_kind = CATCHUP
    opt_in_kinds = kinds.OPT_IN  # taken only when a run asks (`plan.choose_kinds`)

    def __init__(
        self,
        run: Run | None = None,
        *,
        base_url: str | None = None,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._options = dict(run.options) if run else {}
        self._run_id = run.id if run else None
        self._env = env
        self._base_url = base_url
        self._token = token
        self._config: SourceConfig | None = None
        self._client: PipedriveClient | None = None
        self._client_db: Database | None = None
        self._identity: str | None = None
        self._clock: tuple[float, datetime | None] = (0.0, None)  # (monotonic when asked, the source's Date)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "PipedriveProvider()"

    # -- configuration --------------------------------------------------------------------
    def check_options(self, options: Mapping[str, Any]) -> None:
        """`check_options` (module level) with this provider's environment, base URL and token."""
        env = os.environ if self._env is None else self._env
        check_options(options, env, base_url=self._base_url, token=self._token)

    def check_credentials(self, timeout: float) -> None:
        """The launch's token check (`credentials.check_token`): one `GET /v1/users/me`, no retry.
        Raises ConfigError naming PIPEDRIVE_API_TOKEN or PIPEDRIVE_BASE_URL when either is wrong."""
        cfg = self.config()
        credentials.check_token(cfg.base_url, cfg.token, timeout, token_env=ENV_TOKEN, base_env=ENV_BASE_URL)

    def config(self) -> SourceConfig:
        """The source's configuration, read once (`SourceConfig.load`); raises ConfigError naming
        the option or variable that is missing or wrong."""
        if self._config is None:
            env = os.environ if self._env is None else self._env
            self._config = SourceConfig.load(self._options, env, base_url=self._base_url, token=self._token)
        return self._config

    def client(self, db: Database) -> PipedriveClient:
        """The provider's client for `db`, made once per database: paced by `budget(db)`, sharing
        the run's pages asked ahead (`prefetch.Prefetch`) in this process."""
        with self._lock:
            if self._client is None or self._client_db is not db:
                cfg = self.config()
                # a run's pages asked ahead are shared by its lanes in this process (`prefetch.Prefetch`)
                ahead = prefetch_store((db.url, self._run_id)) if self._run_id is not None else None
                self._client = PipedriveClient(cfg.base_url, cfg.token, budget=self.budget(db), prefetch=ahead)
                self._client_db = db
            return self._client

    def budget(self, db: Database) -> Budget:
        """The token's rate-limit budget in `db` (`budget_for`), shared by the process's lanes."""
        cfg = self.config()
        return budget_for(db, cfg.account, cfg.burst_limit)

    # -- the provider protocol ------------------------------------------------------------
    def phases(self) -> list[list[str]]:
        """The data phases (`plan.PHASES`), then the catch-up phase."""
        return [list(group) for group in PHASES] + [[CATCHUP]]

    def depends_on(self, kind: str) -> tuple[str, ...]:
        """The kinds whose rows `kind`'s rows link to (`plan.DEPENDS_ON`; none for an unknown
        kind), so a retry revisits the kinds that skipped rows for want of a parent."""
        return DEPENDS_ON.get(kind, ())

    def account(self) -> str:
        """The rate-limit account (`SourceConfig.account`): no secret in it."""
        return self.config().account

    def identity(self, cost: dict[str, int] | None = None) -> str:
        """The Pipedrive company the token reaches (`/v1/users/me`, asked once per base URL and
        account in a process: a token never changes company): what a run's data belongs to. Two
        tokens of one company are one source; another company is not. `cost` (verify's counter:
        `requests`, `tokens`) counts the request when one is made (2 tokens: a v1 single)."""
        if self._identity is None:
            cfg = self.config()
            key = (cfg.base_url, cfg.account)
            with _identities_lock:
                asking = _asking_identity.setdefault(key, threading.Lock())
            with asking:  # one thread asks; the others wait for its answer
                with _identities_lock:
                    known = _identities.get(key)
                if known is None:
                    known, clock = _ask_identity(cfg)
                    self._clock = (time.monotonic(), clock)
                    if cost is not None:
                        cost["requests"] = int(cost.get("requests", 0)) + 1
                        cost["tokens"] = int(cost.get("tokens", 0)) + inventory.token_cost("/v1/users/me")
                    with _identities_lock:
                        _identities[key] = known
                        while len(_identities) > IDENTITIES_KEPT:
                            _identities.popitem(last=False)
                        _asking_identity.pop(key, None)
                self._identity = known
        return self._identity

    def source_time(self) -> datetime | None:
        """The source's clock now: the `Date` of this provider's identity request when it was made
        within `CLOCK_FRESH_SECONDS` (a run's start asks for both, one after the other), else of
        one `/v1/users/me` asked now (2 tokens, unpaced, as `identity`; it also tells the identity).
        None when the answer carries no date."""
        asked, clock = self._clock
        if clock is not None and time.monotonic() - asked <= CLOCK_FRESH_SECONDS:
            return clock + timedelta(seconds=time.monotonic() - asked)
        cfg = self.config()
        known, clock = _ask_identity(cfg)
        with _identities_lock:
            _identities[(cfg.base_url, cfg.account)] = known
        return clock

    def estimate(self, kinds: list[str] | None = None, *, share: float | None = None) -> Any:
        """What a full run of `kinds` (None: the default kinds) will cost at the source
        (`estimate.estimate`, an `Estimate`): counted with a few cheap calls through an unpaced
        client, at the account's daily token limit and burst limit as its headers say (the
        configured burst limit where they say none) and the engine's daily share (`share`, default
        MIGRATE_DAILY_TOKEN_SHARE). Raises ConfigError for a bad configuration, else as the client does."""
        cfg = self.config()
        planned = list(kinds) if kinds is not None else [k.name for k in kinds_module_default()]
        daily, burst = costs.observed_limits(cfg.base_url, cfg.token)
        with PipedriveClient(cfg.base_url, cfg.token) as client:
            return costs.estimate(client, kinds=planned, share=daily_token_share() if share is None else share,
                                  burst_limit=burst or cfg.burst_limit, daily_limit=daily)

    def source_ids(self, settings: Any, kind: str, options: Mapping[str, Any] | None = None) -> Iterator[tuple[str, str | None]]:
        """Every id the source lists now for `kind`, with its version (`inventory.source_ids`: the
        list endpoint itself, 500 rows a call, v1 walks overlapping so deletions cannot hide a row).
        `options["db"]`: requests go through the account's shared budget; `options["cost"]`: a
        dict counting `requests` and `tokens`; `options["unreachable"]`: a dict that receives the
        items whose sub-resource the source refused ("deal 12" -> (reason, the mail ids the
        product holds under it, read with `options["tenant_id"]`)). NotImplementedError for
        `fields` and `catchup`."""
        options = options or {}
        db = options.get("db")
        if db is not None:
            client = self.client(db)
        else:
            cfg = self.config()
            client = PipedriveClient(cfg.base_url, cfg.token)
        cost = options.get("cost")
        meter = inventory.Meter(client, cost if isinstance(cost, dict) else {})
        unreachable = options.get("unreachable")
        if isinstance(unreachable, dict):
            meter.unreachable = unreachable
        tenant = options.get("tenant_id")
        if db is not None and isinstance(tenant, str):
            meter.held = lambda deal: held_mail(db, tenant, deal)
        return inventory.source_ids(meter, kind)

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        """The first tasks of `kind` in `run`: the v1 stripes, the v2 discoveries (their spans
        bounded by the run's snapshot), the mail discovery, the catch-up's first pages; none
        for a sync's data phases (its catch-up does their work). Raises ConfigError for a kind
        this provider does not have."""
        if kind == "fields":
            return [Successor("fields:all", {})]
        if run.is_sync and kind != CATCHUP:
            # a sync's work is its catch-up (`inventory.py`): one listing per kind brings every
            # change and deletion since the last run; the other phases seed nothing and close at once
            return []
        if kind in stripes.V1_PATHS:
            return stripes.v1_first(kind)
        if kind in stripes.V2_PATHS:
            seeds = stripes.v2_seeds(kind)
            upper = snapshot_bound(run)
            if kind not in stripes.UNSTRIPED and upper:
                seeds = [Successor(s.cursor_key, {**s.cursor, "until": upper}) for s in seeds]
            # a discovery only reads the source and seeds its own phase's walkers: it runs early,
            # while the phase before it ends (`barrier.seed_phase`)
            return [Successor(s.cursor_key, {**s.cursor, "early": True}) if s.cursor.get("discover") is True else s
                    for s in seeds]
        if kind == "emails":
            return stripes.email_seeds()
        if kind == lines.KIND:
            return lines.seeds()
        if kind == contents.KIND:
            return contents.seeds()
        if kind == CATCHUP:
            return inventory.catchup_seeds(run)
        if kind in record_lists.FAMILIES:
            return record_lists.seeds(kind)
        raise ConfigError(f"the pipedrive provider has no kind {kind!r}")

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        """Run one task; its stats gain `requests` and `tokens`, what it asked of the source
        (`inventory.CountingClient`), when it finishes (a rollup's sum is the run's cost)."""
        counting = inventory.CountingClient(self.client(ctx.db))
        try:
            return self._run_task(ctx, counting)  # type: ignore[arg-type]
        finally:
            ctx.stats.bump("requests", counting.requests)
            ctx.stats.bump("tokens", counting.tokens)

    def _run_task(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        kind, cursor = ctx.task.kind, ctx.task.cursor
        if kind == "fields":
            definitions = self.fetch_definitions(client, ctx)
            _remember_book(ctx, FieldBook(definitions))
            writers.write_definitions(ctx, definitions, complete=True)
            return TaskOutcome()
        if kind == contents.KIND:
            if cursor.get("discover"):
                return contents.discover(ctx)
            return contents.run_task(ctx, client, cursor["files"])
        if kind == lines.KIND:
            if cursor.get("discover"):
                return lines.discover(ctx)
            return lines.run_task(ctx, client, self._mapper(ctx), cursor["deals"])
        if kind == "emails":
            if cursor.get("discover"):
                return emails.discover(ctx, client)
            return emails.run_email_task(ctx, client, self.budget(ctx.db), fetch_threads=self.config().fetch_threads)
        if kind in stripes.V1_PATHS:
            return self._v1_page(ctx, client)
        if kind in stripes.V2_PATHS:
            if cursor.get("discover"):
                return self._v2_discover(ctx, client)
            return self._v2_page(ctx, client)
        if kind in record_lists.FAMILIES:
            if cursor.get("discover"):
                return record_lists.discover(ctx)
            return record_lists.run_list_task(ctx, client, self.budget(ctx.db), fetch_threads=self.config().fetch_threads)
        if kind == CATCHUP:
            if cursor.get("contents"):  # the files' contents still to fetch: counted as file contents
                if cursor["contents"] == "discover":
                    return contents.discover(ctx, prefix="catchup:file_contents")
                return inventory.counted_as(ctx, contents.KIND, lambda: contents.run_task(ctx, client, cursor["files"]))
            if cursor.get("lines"):  # a changed deal's lines, listed again: counted as deal products
                mapper = self._mapper_of(ctx)(lines.KIND)
                return inventory.counted_as(ctx, lines.KIND, lambda: lines.run_task(ctx, client, mapper, cursor["lines"]))
            if cursor.get("fanout"):  # a changed record's lists read again: counted as their kind too
                return inventory.counted_as(ctx, cursor["fanout"], lambda: record_lists.run_list_task(
                    ctx, client, self.budget(ctx.db), fetch_threads=self.config().fetch_threads))
            if cursor.get("deals"):  # the catch-up's mail: counted as emails too (the rollup credits them)
                return inventory.counted_as(ctx, "emails", lambda: emails.run_email_task(
                    ctx, client, self.budget(ctx.db), fetch_threads=self.config().fetch_threads))
            if cursor.get("deletes"):
                return inventory.run_deletes(ctx, client, self._mapper_of(ctx))
            return inventory.run_page(ctx, client, self._mapper_of(ctx))
        raise ConfigError(f"the pipedrive provider has no kind {kind!r}")

    # -- listing kinds --------------------------------------------------------------------
    def _mapper(self, ctx: TaskContext) -> writers.Mapper:
        kind, tenant = ctx.task.kind, ctx.run.tenant_id
        book = self.book(ctx) if kind in kinds.ENTITY_OF_KIND else FieldBook()
        fn = kinds.MAPPERS[kind]
        return lambda row: fn(row, tenant, book)

    def _mapper_of(self, ctx: TaskContext) -> Any:
        """kind -> the row mapper of that listing kind (the catch-up maps many kinds in one task)."""
        tenant = ctx.run.tenant_id

        def of(kind: str) -> writers.Mapper:
            book = self.book(ctx) if kind in kinds.ENTITY_OF_KIND else FieldBook()
            fn = kinds.MAPPERS[kind]
            return lambda row: fn(row, tenant, book)

        return of

    def _v1_page(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        listed = list_v1_task(client, ctx.task.kind, ctx.task.cursor, ctx.cancel)
        ask_ahead(client, ctx.task.kind, listed.successors)
        writers.write_listed_page(ctx, listed.rows, self._mapper(ctx), client)
        return TaskOutcome(listed.successors)

    def _v2_discover(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        """Probe both ends of `update_time` (`discover`), cut four spans, seed their walkers and,
        when null-time rows exist, their walker - or, when the first probe's page held the whole
        list, seed one walker that takes that page. Deal lists also record the source's own
        count (`source_total`) for the rollup to compare at phase close: the rows of a list that
        fit the first page, else the deals summary where there is one (archived deals have none
        but a deprecated one, 80 tokens: their count is only known when it fit a page)."""
        kind = ctx.task.kind
        cursor = ctx.task.cursor
        lower, upper = cursor.get("since"), cursor.get("until")
        found = discover(client, stripes.V2_PATHS[kind], ctx.cancel, bounds=stripes.v2_params(cursor))
        summary = SUMMARY_PATHS.get(kind)
        if kind in COUNTED and found.whole is not None:
            ctx.stats.values["source_total"] = found.whole  # set, not added: a retried discovery asks again
        elif kind in COUNTED and summary is not None:
            total = source_total(client, summary, ctx.cancel)
            if total is None:
                ctx.log.note("warning", kind, f"the source does not answer {summary}: no source count to compare with")
            else:
                ctx.stats.values["source_total"] = total
        seeds = discovery_seeds(kind, found, lower, upper)
        # the walkers' first pages are asked now (`prefetch.Prefetch`): a discovery run early
        # (`barrier.seed_phase`) runs in the previous phase's tail, so its walkers start within
        # seconds; one that waits longer than a page is kept asks again (a page's tokens, at most)
        ask_ahead(client, kind, tuple(seeds))
        ctx.stats.values["probe_requests"] = found.requests
        ctx.stats.values["stripes"] = len(seeds)
        if found.nulls:
            ctx.stats.values["null_update_time_seen"] = 1
        return TaskOutcome(tuple(seeds))

    def _v2_page(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        listed = list_v2_task(client, ctx.task.kind, ctx.task.cursor, ctx.cancel)
        ask_ahead(client, ctx.task.kind, listed.successors)
        writers.write_listed_page(ctx, listed.rows, self._mapper(ctx), client)
        if listed.passed:
            # counted after the page is written, so a page retried after a crash counts once; a
            # whole-list walker's rows updated after the snapshot are the catch-up's
            ctx.stats.bump("after_snapshot" if ctx.task.cursor.get("sorted") else "covered_by_spans", listed.passed)
        return TaskOutcome(listed.successors)

    # -- field definitions ----------------------------------------------------------------
    def fetch_definitions(self, client: PipedriveClient, ctx: TaskContext | None = None) -> list[dict[str, Any]]:
        """Every field definition the source serves, normalized (`writers.normal_definition`),
        numbered in each entity's order: the v2 field lists (`/api/v2/dealFields` ...) and the v1
        ones where v2 has none (`/v1/leadFields`, `/v1/noteFields`). Raises as the client does."""
        cancel = ctx.cancel if ctx is not None else None
        out: list[dict[str, Any]] = []
        for entity, path in V2_FIELD_LISTS.items():
            n = 0
            for page in client.iter_v2(path, cancel=cancel):
                for item in page.rows:
                    out.append(writers.normal_definition(entity, item, n))
                    n += 1
        for entity, path in V1_FIELD_LISTS.items():
            n = 0
            for page in client.iter_v1(path, cancel=cancel):
                for item in page.rows:
                    out.append(writers.normal_definition(entity, item, n))
                    n += 1
        return out

    def book(self, ctx: TaskContext) -> FieldBook:
        """The run's field definitions, read once per run: kept in this process by the fields task,
        else from the CRM (another process stored them), else - a run without the fields kind and
        none stored yet - from the source. One lane of the process reads them; the others wait for
        its book (rather than each of a phase's walkers asking the source for every list)."""
        book = _recall_book(ctx)
        if book is not None:
            return book
        with _book_loader(ctx):
            book = _recall_book(ctx)
            if book is not None:
                return book
            with ctx.db.connection() as conn:
                book = writers.book_from_db(conn, ctx.run)
            if not len(book):
                book = FieldBook(self.fetch_definitions(self.client(ctx.db), ctx))
            _remember_book(ctx, book)
        return book


# The source's own count, where the API gives one: only the deals summaries do (`data.total_count`,
# v1 spec `getDealsSummary` / `getArchivedDealsSummary`; "all not archived" / "all archived" deals).
PROBE_LIMIT = 5  # a probe wants one row with a time; a few in case the first have none


def held_mail(db: Database, tenant_id: str, deal_source_id: str) -> list[str]:
    """The source ids of the mail the product holds on one deal (`crm.emails` by its deal's source id)."""
    rows = db.sql("SELECT e.source_id FROM crm.emails e JOIN crm.deals d ON d.id = e.deal_id"
                  " WHERE e.tenant_id = %(t)s AND e.source = 'pipedrive' AND d.source_id = %(d)s",
                  {"t": tenant_id, "d": deal_source_id})
    return [str(r["source_id"]) for r in rows]


def source_total(client: PipedriveClient, path: str, cancel: Any = None) -> int | None:
    """`data.total_count` of a deals summary (an int >= 0); None when the source does not serve the
    summary (404). Raises BadResponse when it answers without a sound `total_count`."""
    try:
        body = client.get(path, cancel=cancel)
    except NotFound:
        return None
    data = body.get("data")
    total = data.get("total_count") if isinstance(data, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise BadResponse("data.total_count is not a count", method="GET", path=path, status=200)
    return total


@dataclass(frozen=True)
class Discovery:
    """What the `update_time` probes of a v2 list found: the oldest and newest update time (None
    when no row has one), whether the list has any row, whether a probe met a row whose
    `update_time` is null, the requests made, `whole`: the number of rows when the first probe's
    page (sorted, `PAGE` rows) held the whole list (None when it went on), and `walk`: the list is
    too short to stripe, one walker goes on from that page (`STRIPE_MIN_ROWS`)."""

    oldest: datetime | None
    newest: datetime | None
    rows: bool
    nulls: bool
    requests: int
    whole: int | None = None
    walk: bool = False

    @property
    def spans(self) -> list[tuple[str | None, str | None]]:
        """[since, until) RFC 3339 spans covering the found update times (`stripes.time_spans`)."""
        return stripes.time_spans(self.oldest, self.newest)


def probe(client: PipedriveClient, path: str, direction: str, cancel: Any = None,
          bounds: Mapping[str, str] | None = None, *, cursor: str | None = None) -> tuple[datetime | None, bool, bool, int]:
    """Walk a v2 list sorted by `update_time` in `direction` (from `cursor`: None, its start)
    until a row with an update time, or the end: (that time or None, any row seen, a null-time
    row seen, requests). Empty pages with a `next_cursor` are walked through: only a null
    `next_cursor` ends a list. `bounds`: the run's `updated_since` / `updated_until` (a bounded
    probe meets no null-time row)."""
    limit, requests, seen, nulls = PROBE_LIMIT, 0, False, False
    params = {"sort_by": "update_time", "sort_direction": direction, **(bounds or {})}
    while True:
        page = client.list_v2(path, params, cursor=cursor, limit=limit, cancel=cancel)
        requests += 1
        seen = seen or bool(page.rows)
        moment, met = _first_time(page.rows)
        nulls = nulls or met
        if moment is not None:
            return moment, seen, nulls, requests
        if not page.more or not page.next_cursor:
            return None, seen, nulls, requests
        cursor = page.next_cursor
        if page.rows:
            limit = stripes.PAGE  # a page without a timed row: walk on in the largest pages


def discover(client: PipedriveClient, path: str, cancel: Any = None, bounds: Mapping[str, str] | None = None) -> Discovery:
    """Both ends of a v2 list's `update_time`. Null-time rows sort at one end (which one depends on
    the server), so they come before any timed row in one of the two probes (`stripes` docstring).
    A full run's probes are unbounded (they must meet the null-time rows), whatever its snapshot.

    The ascending probe asks a whole page (`PAGE` rows: a list call costs the same tokens at any
    limit), held for a walker that asks the same (`stripes.v2_whole_seed`). When that page is the
    list's last, it is the whole list: `whole` is its row count. When the list is estimated below
    `STRIPE_MIN_ROWS` (`estimate_rows`, up to `bounds`' `updated_until` or now), `walk`: one walker
    goes on from that page. Either way no descending probe is made; else the page is dropped and
    the descending probe finds the newest update for the stripes."""
    probe_bounds = {k: v for k, v in (bounds or {}).items() if k == "updated_since"}
    asked = {**stripes.SORTED, **probe_bounds}
    first = client.list_v2(path, asked, limit=stripes.PAGE, cancel=cancel, keep=True)
    if not first.more or not first.next_cursor:
        oldest, nulls = _first_time(first.rows)
        return Discovery(oldest, None, rows=bool(first.rows), nulls=nulls, requests=1, whole=len(first.rows))
    oldest, nulls_a = _first_time(first.rows)
    if oldest is not None:
        until = (bounds or {}).get("updated_until")
        upto = datetime.fromisoformat(until.replace("Z", "+00:00")) if until else datetime.now(timezone.utc)
        estimate = estimate_rows(first.rows, oldest, upto)
        if estimate is not None and estimate < STRIPE_MIN_ROWS:
            return Discovery(oldest, None, rows=True, nulls=nulls_a, requests=1, walk=True)
    client.forget_v2(path, asked, limit=stripes.PAGE)
    req_a = 1
    if oldest is None:  # a first page without a timed row (empty, or null-time rows): walk on to one
        oldest, seen, more_nulls, more_requests = probe(client, path, "asc", cancel, probe_bounds, cursor=first.next_cursor)
        nulls_a, req_a = nulls_a or more_nulls, req_a + more_requests
        if not seen and not first.rows:
            return Discovery(None, None, rows=False, nulls=False, requests=req_a)
    newest, _, nulls_d, req_d = probe(client, path, "desc", cancel, probe_bounds)
    return Discovery(oldest, newest, rows=True, nulls=nulls_a or nulls_d, requests=req_a + req_d)


def discovery_seeds(kind: str, found: Discovery, lower: str | None = None, upper: str | None = None) -> list[Successor]:
    """The walkers a discovery seeds: none for a list empty to its end; one walker in the
    discovery's order from its first page for a list that page held or that is too short to
    stripe (`Discovery.whole`, `.walk`); else one per span (held inside the run's bounds,
    `stripes.bounded_spans`) and the null walker when a probe met a null-time row and the run is
    not a sync (`stripes.v2_stripe_seeds`)."""
    if not found.rows:
        return []
    if found.whole is not None or found.walk:
        return [stripes.v2_whole_seed(kind, lower, upper)]
    spans = stripes.bounded_spans(found.spans, lower, upper) if (lower or upper) else found.spans
    return stripes.v2_stripe_seeds(kind, spans, nulls=found.nulls and lower is None)


@dataclass(frozen=True)
class Listed:
    """One listing task's page, decided but not written: the rows the task writes, how many rows it
    listed but leaves to other walkers (the null walker's timed rows), and the task it hands on to."""

    rows: tuple[dict[str, Any], ...]
    passed: int
    successors: tuple[Successor, ...]


def ask_ahead(client: Any, kind: str, successors: tuple[Successor, ...]) -> None:
    """Ask for the successor walker's page now, while this task writes its own
    (`prefetch.Prefetch`): the request `list_v1_task` / `list_v2_task` will make for it."""
    for s in successors:
        if kind in stripes.V1_PATHS:
            size = kinds.page_of(kind)
            start, _ = stripes.v1_span(s.cursor, size)
            client.prefetch_v1(stripes.V1_PATHS[kind], start=start, limit=stripes.v1_limit(s.cursor, size))
        elif kind in stripes.V2_PATHS and not s.cursor.get("discover"):
            client.prefetch_v2(stripes.V2_PATHS[kind], stripes.v2_params(s.cursor), cursor=s.cursor.get("cursor"), limit=stripes.PAGE)


def list_v1_task(client: PipedriveClient, kind: str, cursor: dict[str, Any], cancel: Any = None) -> Listed:
    """A v1 task's page: asked up to its span's end, handed on by the API's pagination fields
    (`stripes.v1_successors`), never by the number of rows that came back; the list's first spans
    seed the other stripes as it proves long (`stripes.v1_fan_out`). Pages are the kind's
    `page_size` (`kinds.page_of`)."""
    size = kinds.page_of(kind)
    start, _ = stripes.v1_span(cursor, size)
    page = client.list_v1(stripes.V1_PATHS[kind], start=start, limit=stripes.v1_limit(cursor, size), cancel=cancel)
    return Listed(page.rows, 0, stripes.v1_successors(kind, cursor, more=page.more, next_start=page.next_start, page=size))


def list_v2_task(client: PipedriveClient, kind: str, cursor: dict[str, Any], cancel: Any = None) -> Listed:
    """A v2 walker's page; a page with no rows and a `next_cursor` is not the end. The null walker
    lists the whole collection and keeps only its null-time rows (the rest are the spans')."""
    page = client.list_v2(stripes.V2_PATHS[kind], stripes.v2_params(cursor), cursor=cursor.get("cursor"), limit=stripes.PAGE, cancel=cancel)
    rows = page.rows
    if stripes.is_null_walker(cursor):
        rows = tuple(r for r in page.rows if stripes.has_null_time(r))
    elif cursor.get("sorted"):
        rows = tuple(r for r in page.rows if stripes.is_before(r, cursor.get("before")))
    successors = (stripes.v2_next(kind, cursor, page.next_cursor),) if page.more and page.next_cursor else ()
    return Listed(rows, len(page.rows) - len(rows), successors)


def _time(row: Any) -> datetime | None:
    try:
        return mapping.timestamp(row, "update_time")
    except MalformedRow:
        return None


