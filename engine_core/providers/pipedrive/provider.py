"""The Pipedrive provider (source "pipedrive"): a whole account into the product's CRM tables.

Phases are data (`plan.PHASES`): field definitions, users and pipelines; organizations and
stages; persons; deals and leads (archived ones from their own endpoints); activities; notes; then
every deal's email. Full history always: every list is walked from its start, never `/v1/recents`
(a month at most).

Tasks and cursors (details in `stripes.py`):

* `fields` - one task a run (`fields:all`): every field definition, stored in
  crm.custom_field_definitions so the product can show custom values by name and option label;
  the other tasks read them from there once per run.
* v1 kinds (users, leads, leads_archived, notes, files) - offset pages: one walker walks the
  first `STRIPE_MIN_PAGES` spans (500 rows; files 100) span after span while the API says more,
  then four stripes own the spans after by page arithmetic (each hands on span + 4 x 500); a
  shorter page the API says is not the last goes on at its `next_start`.
* v2 kinds (organizations, persons, deals, deals_archived, activities) - cursor pages striped by
  ranges of `update_time`: a discovery task finds the oldest and newest update (walking past
  empty pages) and seeds four walkers over four equal spans (the first and last open-ended), plus
  one over the unfiltered list for rows whose `update_time` is null when there are any; each
  creates its next page - a list estimated below `STRIPE_MIN_PAGES` pages has one walker instead,
  from the discovery's own first page (`discover`). The deal lists record the source's own count
  (`source_total`: the rows of a list one walker walks, counted by it; `/v1/deals/summary` for a
  striped list) in their task stats.
  Pipelines and stages (short v2 lists without time filters) have one walker each; a deal links to
  its pipeline and stage when they are here.
* `emails` - discovery walks the deal lists and seeds tasks of ten deals with mail; each task
  fetches bodies in rounds of four on four threads holding no database connection (`emails.py`).
* `catchup` - the last phase: a run records its snapshot moment (the source's `Date`,
  `source_time`); the v2 spans end at it, and the catch-up walks each kind's whole list once,
  parents first, writing what the ledger lacks or holds at an older version (a row that moved
  between spans, offsets or lists while the run walked; changes since), marking what a GET
  confirms deleted, and fetching mail for changed deals with more mail than the product holds
  (`catchup.py`). A sync (mode 'sync') seeds only the field definitions and its catch-up.
  `source_ids` is the same listing, for verify.

Configuration (base URL, token, burst limit) and the run options it takes: `settings.py`. How a
listing task reads its page (discovery probes, walkers, pages asked ahead): `listing.py`.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from engine_core import definitions as engine_definitions, holdings
from engine_core.budget import Budget
from engine_core.config import daily_token_share, shown_url
from engine_core.context import TaskContext
from engine_core.db import Database
from engine_core.errors import ConfigError
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.source import margin_option
from engine_core.file_contents import file_store
from engine_core.providers.pipedrive import estimate as costs
from engine_core.providers.pipedrive import (catchup, contents, credentials, emails, inventory, kinds, lines,
                                             record_lists, stripes, writers)
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.meter import CountingClient, Meter, token_cost
from engine_core.providers.pipedrive.prefetch import Prefetch, prefetch_store
from engine_core.providers.pipedrive.fields import FieldBook
from engine_core.providers.pipedrive.kinds import COUNTED, SUMMARY_PATHS, V1_FIELD_LISTS, V2_FIELD_LISTS
from engine_core.providers.pipedrive.ahead import Ahead, ask_fields
from engine_core.providers.pipedrive.listing import discover, discovery_seeds, list_v1_task, list_v2_task, source_total
from engine_core.providers.pipedrive.plan import CATCHUP, DEPENDS_ON, PHASES
from engine_core.providers.pipedrive.settings import (BOOLEAN_WORDS, ENV_BASE_URL, ENV_TOKEN, OPTIONS,
                                                      SECRET_OPTIONS, SourceConfig, check_base_url)

SOURCE = "pipedrive"


def check_options(options: Mapping[str, Any], env: Mapping[str, str], *, base_url: str | None = None,
                  token: str | None = None) -> None:
    """Refuse, with ConfigError (one line naming the option), a run option a Pipedrive run does
    not take (`OPTIONS`; a token among them is named as such) or a value the run would refuse
    later (`SourceConfig.load`, the booleans, `source.margin_option`, the file store's variables:
    `file_contents.file_store`). Sends nothing."""
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
    file_store(env)  # the file store's variables (MIGRATE_FILE_STORE, MIGRATE_FILE_MAX_BYTES), named when bad


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


# The company a (base URL, token) reaches, as `/v1/users/me` said (`identity`): a token belongs to one
# company for life, so a process asks once per base URL and account (the run's start, lanes, later runs).
IDENTITIES_KEPT = 32
# The `Date` of the identity's answer stands for the source's clock (`source_time`) this long after.
CLOCK_FRESH_SECONDS = 5.0
_identities: OrderedDict[tuple[str, str], str] = OrderedDict()
_identities_lock = threading.Lock()
_asking_identity: dict[tuple[str, str], threading.Lock] = {}


def _ask_identity(cfg: SourceConfig, budget: Budget | None) -> tuple[str, datetime | None]:
    """(the company's identity, the source's clock when it answered) from one `/v1/users/me`, paced
    by the account's `budget` when given (unpaced, it may be one beyond the burst window's limit)."""
    with PipedriveClient(cfg.base_url, cfg.token, budget=budget) as client:
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
                self._client = PipedriveClient(cfg.base_url, cfg.token, budget=self.budget(db), prefetch=self._store(db))
                self._client_db = db
            return self._client

    def _store(self, db: Database) -> Prefetch | None:
        """The run's pages asked ahead in this process (`prefetch.Prefetch`), shared by its lanes'
        clients of the same source and token: a page asked under other credentials is never served."""
        if self._run_id is None:
            return None
        cfg = self.config()
        credentials = hashlib.sha256(f"{cfg.base_url}\n{cfg.token}".encode()).hexdigest()[:16]
        return prefetch_store((db.url, self._run_id, credentials))

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

    def identity(self, cost: dict[str, int] | None = None, db: Database | None = None) -> str:
        """The Pipedrive company the token reaches (`/v1/users/me`, asked once per base URL and
        account in a process: a token never changes company): what a run's data belongs to. Two
        tokens of one company are one source; another company is not. `cost` (verify's counter:
        `requests`, `tokens`) counts the request when one is made (2 tokens); `db` paces it (`budget`)."""
        if self._identity is None:
            cfg = self.config()
            key = (cfg.base_url, cfg.account)
            with _identities_lock:
                asking = _asking_identity.setdefault(key, threading.Lock())
            with asking:  # one thread asks; the others wait for its answer
                with _identities_lock:
                    known = _identities.get(key)
                if known is None:
                    known, clock = _ask_identity(cfg, self.budget(db) if db is not None else None)
                    self._clock = (time.monotonic(), clock)
                    if cost is not None:
                        cost["requests"] = int(cost.get("requests", 0)) + 1
                        cost["tokens"] = int(cost.get("tokens", 0)) + token_cost("/v1/users/me")
                    with _identities_lock:
                        _identities[key] = known
                        while len(_identities) > IDENTITIES_KEPT:
                            _identities.popitem(last=False)
                        _asking_identity.pop(key, None)
                self._identity = known
        return self._identity

    def source_time(self, db: Database | None = None) -> datetime | None:
        """The source's clock now: the `Date` of this provider's identity request when it was made
        within `CLOCK_FRESH_SECONDS` (a run's start asks for both, one after the other), else of
        one `/v1/users/me` asked now (2 tokens, paced as `identity` is with `db`; it also tells the
        identity). None when the answer carries no date."""
        asked, clock = self._clock
        if clock is not None and time.monotonic() - asked <= CLOCK_FRESH_SECONDS:
            return clock + timedelta(seconds=time.monotonic() - asked)
        cfg = self.config()
        known, clock = _ask_identity(cfg, self.budget(db) if db is not None else None)
        with _identities_lock:
            _identities[(cfg.base_url, cfg.account)] = known
        return clock

    def estimate(self, kinds: list[str] | None = None, *, share: float | None = None, walked: Any = None) -> Any:
        """What a full run of `kinds` (None: the default kinds; `walked`: the kinds its catch-up walks,
        default `kinds`) costs at the source (`estimate.estimate`, an `Estimate`): counted with a few
        cheap calls through an unpaced client, at the account's daily token limit and burst limit as
        its headers say (else the configured burst limit) and the engine's daily share (`share`,
        default MIGRATE_DAILY_TOKEN_SHARE). Raises ConfigError for a bad configuration, else as the client does."""
        cfg = self.config()
        planned = list(kinds) if kinds is not None else [k.name for k in kinds_module_default()]
        daily, burst = costs.observed_limits(cfg.base_url, cfg.token)
        with PipedriveClient(cfg.base_url, cfg.token) as client:
            return costs.estimate(client, kinds=planned, share=daily_token_share() if share is None else share,
                                  burst_limit=burst or cfg.burst_limit, daily_limit=daily, walked=walked)

    def progress_weights(self) -> dict[str, float]:
        """What each kind costs a run, relative to the others (`estimate.reference_weights`): how
        `migrate status` weighs a run's phases into its percent and ETA."""
        return costs.reference_weights()

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
        meter = Meter(client, cost if isinstance(cost, dict) else {})
        unreachable = options.get("unreachable")
        if isinstance(unreachable, dict):
            meter.unreachable = unreachable
        tenant = options.get("tenant_id")
        if db is not None and isinstance(tenant, str):
            meter.held = lambda deal: holdings.mail_on_deal(db, tenant, self.source, deal)
        return inventory.source_ids(meter, kind)

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        """The first tasks of `kind` in `run`: the v1 stripes, the v2 discoveries (their spans
        bounded by the run's snapshot), the mail discovery, the catch-up's first pages; none
        for a sync's data phases (its catch-up does their work). Raises ConfigError for a kind
        this provider does not have."""
        if kind == "fields":
            return [Successor("fields:all", {})]
        if run.is_sync and kind != CATCHUP:
            # a sync's work is its catch-up (`catchup.py`): one listing per kind brings every
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
            return catchup.catchup_seeds(run)
        if kind in record_lists.FAMILIES:
            return record_lists.seeds(kind)
        raise ConfigError(f"the pipedrive provider has no kind {kind!r}")

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        """Run one task; its stats gain `requests` and `tokens`, what it asked of the source
        (`meter.CountingClient`), when it finishes (a rollup's sum is the run's cost)."""
        counting = CountingClient(self.client(ctx.db))
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
            engine_definitions.write_definitions(ctx, definitions, complete=True)
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
                return catchup.counted_as(ctx, contents.KIND, lambda: contents.run_task(ctx, client, cursor["files"]))
            if cursor.get("lines"):  # a changed deal's lines, listed again: counted as deal products
                mapper = self._mapper_of(ctx)(lines.KIND)
                return catchup.counted_as(ctx, lines.KIND, lambda: lines.run_task(ctx, client, mapper, cursor["lines"]))
            if cursor.get("fanout"):  # a changed record's lists read again: counted as their kind too
                return catchup.counted_as(ctx, cursor["fanout"], lambda: record_lists.run_list_task(
                    ctx, client, self.budget(ctx.db), fetch_threads=self.config().fetch_threads))
            if cursor.get("deals"):  # the catch-up's mail: counted as emails too (the rollup credits them)
                return catchup.counted_as(ctx, "emails", lambda: emails.run_email_task(
                    ctx, client, self.budget(ctx.db), fetch_threads=self.config().fetch_threads))
            if cursor.get("deletes"):
                return catchup.run_deletes(ctx, client, self._mapper_of(ctx))
            if (store := self._store(ctx.db)) is not None:
                store.cut(ctx.task.phase)  # no page asked for the walks before stands for one of this walk
            return catchup.run_page(ctx, client, self._mapper_of(ctx))
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

    def _ahead(self, ctx: TaskContext) -> Ahead:
        """What this listing task asks ahead (`ahead.Ahead`)."""
        return Ahead(ctx, self.client(ctx.db), self._store(ctx.db), self._mapper_of(ctx), self.seed_cursors)

    def _v1_page(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        listed = list_v1_task(client, ctx.task.kind, ctx.task.cursor, ctx.cancel)
        ahead = self._ahead(ctx)
        ahead.walk(client, listed.successors)
        writers.write_listed_page(ctx, listed.rows, self._mapper(ctx), client)
        ahead.count()
        return TaskOutcome(listed.successors)

    def _v2_discover(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        """Probe both ends of `update_time` (`discover`), cut four spans, seed their walkers and,
        when null-time rows exist, their walker - or, when the first probe's page held the whole
        list or the list is too short to stripe, seed one walker that takes that page. Deal lists
        also record the source's own count (`source_total`) for the rollup to compare at phase
        close: the rows of a list that fit the first page; for a list one walker walks, its last
        page records the rows the walk listed (`listing.Listed.total`); only a striped list asks the
        deals summary (40 tokens), whose count is the spans' independent check. Archived deals
        have no summary but a deprecated one (80 tokens): a striped archive list goes uncounted."""
        kind = ctx.task.kind
        cursor = ctx.task.cursor
        lower, upper = cursor.get("since"), cursor.get("until")
        self._fields_ahead(ctx)
        found = discover(client, stripes.V2_PATHS[kind], ctx.cancel, bounds=stripes.v2_params(cursor))
        seeds = discovery_seeds(kind, found, lower, upper)
        # the walkers' first pages are asked now (`prefetch.Prefetch`), before the summary below: a
        # discovery run early (`barrier.seed_phase`) runs in the previous phase's tail, so its walkers
        # start within seconds; one that waits longer than a page is kept asks again (a page's tokens)
        self._ahead(ctx).discovered(client, tuple(seeds))
        summary = SUMMARY_PATHS.get(kind)
        if kind in COUNTED and found.whole is not None:
            ctx.stats.values["source_total"] = found.whole  # set, not added: a retried discovery asks again
        elif kind in COUNTED and summary is not None and not found.walk:
            total = source_total(client, summary, ctx.cancel)
            if total is None:
                ctx.log.note("warning", kind, f"the source does not answer {summary}: no source count to compare with")
            else:
                ctx.stats.values["source_total"] = total
        ctx.stats.values["probe_requests"] = found.requests
        ctx.stats.values["stripes"] = len(seeds)
        if found.nulls:
            ctx.stats.values["null_update_time_seen"] = 1
        return TaskOutcome(tuple(seeds))

    def _v2_page(self, ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
        listed = list_v2_task(client, ctx.task.kind, ctx.task.cursor, ctx.cancel)
        ahead = self._ahead(ctx)
        ahead.walk(client, listed.successors)
        writers.write_listed_page(ctx, listed.rows, self._mapper(ctx), client)
        ahead.count()
        if listed.total is not None:
            ctx.stats.values["source_total"] = listed.total  # the counting walker's last page: set, not added
        if listed.passed:
            # counted after the page is written, so a page retried after a crash counts once; a
            # whole-list walker's rows updated after the snapshot are the catch-up's
            ctx.stats.bump("after_snapshot" if ctx.task.cursor.get("sorted") else "covered_by_spans", listed.passed)
        return TaskOutcome(listed.successors)

    # -- field definitions ----------------------------------------------------------------
    def _fields_ahead(self, ctx: TaskContext) -> None:
        """Ask the field lists now (`ahead.ask_fields`) when the run's book is neither in this process
        nor stored: the run's first page would wait for them a round trip after its discovery."""
        if ctx.task.kind in kinds.ENTITY_OF_KIND and _recall_book(ctx) is None:
            with ctx.db.connection() as conn:
                stored = engine_definitions.stored_definitions(conn, ctx.run)
            if not stored:
                ask_fields(self.client(ctx.db))

    def fetch_definitions(self, client: PipedriveClient, ctx: TaskContext | None = None) -> list[dict[str, Any]]:
        """Every field definition the source serves, normalized (`writers.normal_definition`),
        numbered in each entity's order: the v2 field lists (`/api/v2/dealFields` ...) and the v1
        ones where v2 has none (`/v1/leadFields`, `/v1/noteFields`). Raises as the client does."""
        cancel = ctx.cancel if ctx is not None else None
        # every list's first page asked at once (the client's Prefetch): one round trip of the
        # source's latency instead of seven one after another before a run's first page is written
        for path in V2_FIELD_LISTS.values():
            client.prefetch_v2(path)
        for path in V1_FIELD_LISTS.values():
            client.prefetch_v1(path)
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
                book = FieldBook(engine_definitions.stored_definitions(conn, ctx.run))
            if not len(book):
                book = FieldBook(self.fetch_definitions(self.client(ctx.db), ctx))
            _remember_book(ctx, book)
        return book

