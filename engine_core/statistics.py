"""Statistics of its own: the planner statistics of the tables the engine grows are kept
fresh by the engine, so its speed does not depend on the server's autovacuum settings.

Why: the engine's lookups (the ledger's claim and reference queries, the contact and company
matches) are planned on the statistics Postgres last gathered. On a server whose autovacuum is off
(some DBAs switch it off for bulk loads) those are the empty tables' statistics for the whole run,
and the per-row write path fell from 773 to 138 rows/s (measured on this machine). The
mechanism, measured (bench/README.md): psycopg prepares a statement after 5 executions and
Postgres then keeps a generic plan costed while the table was nearly empty - `crm.match_contact`
scanned all of a tenant's contacts per row (58 ms at 20,000 rows, 0.04 ms after ANALYZE). Growth
alone never replans it; an ANALYZE invalidates every cached plan on the table. Hence the low
thresholds: a table is analyzed soon after it starts to grow, then every fifth of its size.

Two moments, both outside any window's or barrier's transaction:
- **Phase boundaries.** The barrier's winner, after its transaction commits, analyzes every grown
  table that changed by more than `BOUNDARY_MIN_ROWS + BOUNDARY_FRACTION x rows` since its last
  analyze: the next phase resolves its references against what the last one wrote.
- **Growth.** Any caller may ask `maybe_refresh`; at most every `check_seconds` per process (a
  clock comparison otherwise) it reads `pg_stat_user_tables.n_mod_since_analyze` against
  `pg_class.reltuples` and analyzes the tables changed by more than `min_rows + fraction x rows`
  (autovacuum's own rule, `autovacuum_analyze_threshold + autovacuum_analyze_scale_factor x
  reltuples`, with thresholds of ours).

Each ANALYZE runs on its own pooled connection in its own short transaction (ANALYZE, unlike
VACUUM, may run in one) under `pg_try_advisory_xact_lock(ANALYZE_LOCK, hashtext(table))`: two
workers never analyze one table at once, the loser just skips it. `lock_timeout` bounds the wait
for the table's SHARE UPDATE EXCLUSIVE lock (held by a running autovacuum or a DDL). A failure is
logged and never fails the caller's task: statistics are an optimisation.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from psycopg import sql

from engine_core.db import Database

log = logging.getLogger(__name__)

# The tables the engine grows during a run: its own ledger and tasks, and the product's CRM tables.
# Unqualified names resolve through the connection's search_path, as the engine's queries do.
GROWN_TABLES: tuple[str, ...] = (
    "migration_records",
    "migration_tasks",
    "migration_dry_records",
    "crm.users",
    "crm.custom_field_definitions",
    "crm.pipelines",
    "crm.stages",
    "crm.companies",
    "crm.contacts",
    "crm.deals",
    "crm.leads",
    "crm.activities",
    "crm.notes",
    "crm.emails",
)

ANALYZE_LOCK = 774_200  # advisory lock class; the second key is hashtext(the table's qualified name)
DEFAULT_FRACTION = 0.2  # analyze once a table changed by a fifth of its rows (autovacuum: 0.1)
DEFAULT_MIN_ROWS = 500  # ... and by at least this many rows (autovacuum: 50)
DEFAULT_CHECK_SECONDS = 2.0  # at most one pg_stat_user_tables read (~1 ms) per process this often
BOUNDARY_FRACTION = 0.02  # at a phase boundary nearly every grown table is analyzed
BOUNDARY_MIN_ROWS = 50
LOCK_TIMEOUT = "2s"


@dataclass(frozen=True)
class Growth:
    """One table's changes since its last analyze: `rows` is `pg_class.reltuples` (-1 never
    analyzed nor vacuumed, read as 0), `changed` is `pg_stat_user_tables.n_mod_since_analyze`."""

    table: str  # schema-qualified, e.g. "crm.contacts"
    schema: str
    name: str
    rows: float
    changed: int
    analyze_count: int

    def due(self, fraction: float, min_rows: int) -> bool:
        """Changed by more than `min_rows + fraction x rows` (autovacuum's analyze rule)."""
        return self.changed > 0 and self.changed >= min_rows + fraction * max(self.rows, 0.0)


def growth(db: Database, tables: Iterable[str] = GROWN_TABLES) -> list[Growth]:
    """The grown tables' changes since their last analyze, one query; tables that do not exist
    (an older schema) are left out."""
    rows = db.fetch_all("table_growth", {"tables": list(tables)})
    return [
        Growth(f"{r['schemaname']}.{r['relname']}", r["schemaname"], r["relname"], float(r["reltuples"]),
               int(r["n_mod_since_analyze"]), int(r["analyze_count"]))
        for r in rows
    ]


def analyze(db: Database, tables: Sequence[Growth]) -> list[str]:
    """ANALYZE each table on its own pooled connection, skipping one another worker is analyzing
    right now; returns the tables analyzed. Errors are logged, never raised."""
    done: list[str] = []
    for t in tables:
        try:
            with db.transaction() as tx:
                got = tx.fetch_one("try_analyze_lock", {"lock": ANALYZE_LOCK, "table": t.table})
                if not (got and got["locked"]):
                    continue  # another worker is analyzing it: once is enough
                tx.sql(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
                tx.sql(sql.SQL("ANALYZE {}").format(sql.Identifier(t.schema, t.name)))
            done.append(t.table)
        except Exception as e:  # statistics are an optimisation: the task goes on without them
            log.warning("ANALYZE %s skipped: %s", t.table, str(e).splitlines()[0] if str(e) else type(e).__name__)
    if done:
        log.info("analyzed %s", ", ".join(done))
    return done


class Statistics:
    """Keeps one database's grown tables analyzed; one per process and database (`for_db`).

    `maybe_refresh()` is cheap to call often: it reads the server at most every `check_seconds`.
    `at_boundary()` is for the barrier's winner. Both return the tables they analyzed.
    """

    def __init__(
        self,
        db: Database,
        *,
        tables: Sequence[str] = GROWN_TABLES,
        fraction: float = DEFAULT_FRACTION,
        min_rows: int = DEFAULT_MIN_ROWS,
        check_seconds: float = DEFAULT_CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fraction < 0 or min_rows < 0 or check_seconds < 0:
            raise ValueError(f"statistics thresholds must be >= 0, got fraction={fraction}, "
                             f"min_rows={min_rows}, check_seconds={check_seconds}")
        self.db = db
        self.tables = tuple(tables)
        self.fraction = fraction
        self.min_rows = min_rows
        self.check_seconds = check_seconds
        self.clock = clock
        self._checked: float | None = None
        self._lock = threading.Lock()

    def _claim_check(self) -> bool:
        # One lane thread of the process checks; the others go on at once.
        with self._lock:
            now = self.clock()
            if self._checked is not None and now - self._checked < self.check_seconds:
                return False
            self._checked = now
            return True

    def maybe_refresh(self) -> list[str]:
        """Analyze the tables grown past `min_rows + fraction x rows`, at most every `check_seconds`."""
        if not self._claim_check():
            return []
        return self.refresh(self.fraction, self.min_rows)

    def at_boundary(self) -> list[str]:
        """A phase closed: analyze every table it grew by more than a few rows."""
        with self._lock:
            self._checked = self.clock()
        return self.refresh(BOUNDARY_FRACTION, BOUNDARY_MIN_ROWS)

    def refresh(self, fraction: float, min_rows: int) -> list[str]:
        """Analyze now the tables changed by at least `min_rows + fraction x rows`."""
        try:
            due = [g for g in growth(self.db, self.tables) if g.due(fraction, min_rows)]
        except Exception as e:
            log.warning("table statistics not read: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
            return []
        return analyze(self.db, due) if due else []


_KEEPERS: weakref.WeakKeyDictionary[Database, Statistics] = weakref.WeakKeyDictionary()
_KEEPERS_LOCK = threading.Lock()


def for_db(db: Database) -> Statistics:
    """The process's keeper for this pool (created with the defaults on first use)."""
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(db)
        if keeper is None:
            keeper = _KEEPERS[db] = Statistics(db)
        return keeper


# The boundary's ANALYZE off the lane (`after_advance(background=True)`): one thread per process,
# one boundary at a time, started on first use.
_BACKGROUND: ThreadPoolExecutor | None = None
_BACKGROUND_LOCK = threading.Lock()


def _background() -> ThreadPoolExecutor:
    global _BACKGROUND
    with _BACKGROUND_LOCK:
        if _BACKGROUND is None:
            _BACKGROUND = ThreadPoolExecutor(max_workers=1, thread_name_prefix="statistics")
        return _BACKGROUND


def after_advance(db: Database, *, closed: bool, background: bool = False) -> list[str] | Future[list[str]]:
    """The barrier's call site (`barrier.advance_phase`, after its transactions commit): the
    winner of a phase boundary analyzes what the phase grew; every other finisher makes the cheap
    growth check. Never raises.

    `background` (a lane's worker): the boundary's analyze runs on this process's
    statistics thread and the call returns its Future at once, so the winner's lane claims the
    next phase's work instead of waiting ~0.1 s for ANALYZE while the phase's other walkers wait
    for a lane. Statistics are an optimisation and an ANALYZE invalidates every cached plan on
    its table, so the next phase's first statements planned before it lands are replanned after."""
    keeper = for_db(db)
    if not closed:
        return keeper.maybe_refresh()
    if background:
        return _background().submit(keeper.at_boundary)
    return keeper.at_boundary()
