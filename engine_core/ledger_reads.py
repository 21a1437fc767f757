"""The ledger read after the fact: the run's report, `explain`, `verify`, `migrate rows` and the
Dagster ledger checks.

Read-only queries over the ledger's tables (`migration_records`, `migration_record_history`,
`migration_unreadable`, `migration_inventory`) and the product tables its claims point at. The
write path, and the reads it needs while it writes (versions, held entries, references
resolved), are in `ledger.py`: together the two modules are the ledger's one door.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from engine_core.db import Conn, Database, stream
from engine_core.rows import WAITING, WAITS_FOR_WALK

# -- reads for the run's report (rollup), `explain` and `verify` ------------------------------


def placeholder_reason(conn: Conn, run: Any, kind: str, source_id: str) -> str | None:
    """The reason of run `run`'s skipped placeholder of (`kind`, `source_id`) in `conn`'s
    transaction, or None when the run holds none (the row was written, or was here already). A dry
    run reads it inside the row's savepoint, before the rollback takes it (`window.Windows`)."""
    row = conn.fetch_one("placeholder_reason", {"run_id": run.id, "tenant_id": run.tenant_id, "source": run.source,
                                                "kind": kind, "source_id": source_id})
    return row["reason"] if row else None



def history_counts(db: Database | Conn, run_id: int) -> dict[str, dict[str, int]]:
    """What a run changed, per ledger kind: {"deals": {"updated": 3, "deleted": 1, "restored": 0}}
    (changes absent count 0; kinds without any are absent)."""
    out: dict[str, dict[str, int]] = {}
    for r in db.fetch_all("history_counts", {"run_id": run_id}):
        out.setdefault(r["kind"], {"updated": 0, "deleted": 0, "restored": 0})[r["action"]] = int(r["n"])
    return out


def waiting_counts(db: Database | Conn, run_id: int) -> dict[str, int]:
    """Run `run_id`'s placeholders still left to the catch-up's walk (skipped, not deleted at the
    source, reason saying `rows.WAITS_FOR_WALK`), per ledger kind; kinds without any are absent."""
    rows = db.fetch_all("ledger_waiting_counts", {"run_id": run_id, "waiting": WAITS_FOR_WALK})
    return {r["kind"]: int(r["n"]) for r in rows}


def placeholders_of_run(conn: Conn, run: Any, kind: str, ids: Sequence[str], raw_keys: Sequence[str]) -> dict[str, str]:
    """The placeholders run `run` holds among a window's rows of ledger kind `kind`, before the
    window writes them: source id (or "raw:" + raw key, a row without a readable id, migration
    0013) -> what the run counted it as: "waiting" (skipped, its reason `rows.WAITS_FOR_WALK`),
    "skipped" or "failed". Rows it holds written, rows another run holds and rows it does not hold
    are absent. What a catch-up's stats hear (`models.Stats.heard`)."""
    if not ids and not raw_keys:
        return {}
    rows = conn.fetch_all("placeholders_of_run", {"r": run.id, "t": run.tenant_id, "s": run.source, "k": kind,
                                                  "ids": list(ids), "raws": list(raw_keys)})
    return {r["key"]: (WAITING if r["action"] == "skipped" and WAITS_FOR_WALK in (r["reason"] or "") else r["action"])
            for r in rows}


def written_by_kind(db: Database | Conn, run_id: int) -> list[dict[str, Any]]:
    """Rows {kind, created, matched}: the ledger entries a run holds written, per ledger kind."""
    return db.fetch_all("ledger_written_by_kind", {"run_id": run_id})


def reasons(db: Database | Conn, run_id: int) -> list[dict[str, Any]]:
    """Rows {kind, action, reason, n, samples}: a run's unwritten ledger entries grouped by reason."""
    return db.fetch_all("ledger_reasons", {"run_id": run_id})


def unreadable_reasons(db: Database | Conn, run_id: int) -> list[dict[str, Any]]:
    """Rows {kind, action, reason, n, samples}: a run's rows without a readable id, by reason."""
    return db.fetch_all("unreadable_reasons", {"run_id": run_id})


def explain(db: Database | Conn, tenant_id: str, kind: str, source_id: str, source: str | None) -> dict[str, Any] | None:
    """The tenant's ledger entry of one source row with the run and task that wrote it, or None."""
    return db.fetch_one("explain_record", {"tenant_id": tenant_id, "kind": kind, "source_id": source_id, "source": source})


def row_history(db: Database | Conn, entry_id: int) -> list[dict[str, Any]]:
    """What later runs did to ledger entry `entry_id`'s row, oldest first: rows {run_id, run_mode
    ("full" | "sync"), action ("updated" | "deleted" | "restored"), at, version_before,
    version_after, before (the product row's previous values of the columns an update changed)}."""
    return db.fetch_all("explain_history", {"record_id": entry_id})


def explain_unreadable(db: Database | Conn, tenant_id: str, kind: str, raw_key: str, source: str | None) -> list[dict[str, Any]]:
    """The tenant's rows without a readable id kept under `raw_key`, the latest first."""
    return db.fetch_all("explain_unreadable", {"tenant_id": tenant_id, "kind": kind, "raw_key": raw_key, "source": source})


def ledger_index(conn: Conn | Database, tenant_id: str, source: str, kind: str, *,
                 placeholders: bool = False) -> dict[str, tuple[str | None, datetime | None]]:
    """Every written (created or matched) entry of one ledger kind of a tenant's source:
    {source_id: (source_version, deleted_at_source)}; with `placeholders`, skipped and failed
    entries too (their version is None). One query; a kind of a million rows is a million items."""
    rows = conn.fetch_all("ledger_index", {"tenant_id": tenant_id, "source": source, "kind": kind,
                                           "placeholders": placeholders})
    return {r["source_id"]: (r["source_version"], r["deleted_at_source"]) for r in rows}


def tenant_entries(db: Database | Conn, tenant_id: str, source: str, kind: str) -> list[dict[str, Any]]:
    """Rows {source_id, action, reason, record_type, record_id, version, deleted}: every ledger entry of
    the tenant for one ledger kind, placeholders included (what verify compares)."""
    return db.fetch_all("verify_ledger", {"tenant_id": tenant_id, "source": source, "kind": kind})


def tenant_unreadable(db: Database | Conn, tenant_id: str, source: str, kind: str) -> list[dict[str, Any]]:
    """Rows {source_id}: the raw keys (`rows.unreadable_key`) of the tenant's rows of one kind kept
    without a readable id, one per row."""
    return db.fetch_all("verify_unreadable", {"tenant_id": tenant_id, "source": source, "kind": kind})


def owed_of_kind(db: Database | Conn, tenant_id: str, source: str, kind: str) -> list[dict[str, Any]]:
    """Rows {source_id, parent_kind}: one ledger kind's written entries with a link owed to a kind
    a run left out (`owed_links`), one row per owed link."""
    return db.fetch_all("owed_of_kind", {"tenant_id": tenant_id, "source": source, "kind": kind})


def dangling_counts(db: Database | Conn, run_id: int) -> dict[str, int]:
    """Per ledger kind: rows this run imported with at least one reference to a parent that does
    not exist at the source - `{"deals": 4, "persons": 6}`; kinds without any
    are absent. Reads the claims the run holds (a row another run wrote is that run's count)."""
    return {r["kind"]: int(r["n"]) for r in db.fetch_all("dangling_counts", {"run_id": run_id})}


# -- reads for the face: `migrate rows` and `explain`, the Dagster ledger checks ------------------


# Every skipped, waiting or failed row of a tenant as the ledger holds it now (one row per source row:
# the run that last wrote it), with the rows kept beside it for want of a readable id (failed, their
# raw key as id). A placeholder whose reason leaves a parent to the catch-up's walk
# (`rows.WAITS_FOR_WALK`) is `waiting` here, as the rollup counts it, not skipped. Sorted as
# `migrate rows` prints them; ids by length first, so 9 comes before 10.
ROWS_SQL = """
SELECT * FROM (
    SELECT r.kind, r.source, r.source_id AS id,
           CASE WHEN r.action = 'skipped' AND position(%(waits)s IN COALESCE(r.reason, '')) > 0
                THEN 'waiting' ELSE r.action END AS action,
           r.migration_id AS run_id, r.reason, r.deleted_at_source, false AS unreadable, m.dry_run
      FROM migration_records r JOIN migrations m ON m.id = r.migration_id
     WHERE r.tenant_id = %(t)s AND r.action IN ('skipped', 'failed')
       AND (%(k)s::text IS NULL OR r.kind = %(k)s) AND (%(run)s::bigint IS NULL OR r.migration_id = %(run)s)
    UNION ALL
    SELECT u.kind, u.source, u.raw_key, 'failed', u.migration_id, u.reason, NULL, true, m.dry_run
      FROM migration_unreadable u JOIN migrations m ON m.id = u.migration_id
     WHERE u.tenant_id = %(t)s AND 'failed' = ANY(%(actions)s)
       AND (%(k)s::text IS NULL OR u.kind IN (%(k)s, %(k)s || '_archived'))
       AND (%(run)s::bigint IS NULL OR u.migration_id = %(run)s)
) AS found
WHERE action = ANY(%(actions)s)
ORDER BY kind, action, length(id), id, source
LIMIT %(limit)s
"""
ROWS_COUNT_SQL = """
SELECT count(*) FILTER (WHERE action = 'skipped' AND NOT waits AND 'skipped' = ANY(%(actions)s)) AS skipped,
       count(*) FILTER (WHERE waits AND 'waiting' = ANY(%(actions)s)) AS waiting,
       count(*) FILTER (WHERE action = 'failed' AND 'failed' = ANY(%(actions)s)) AS failed
  FROM (SELECT action, action = 'skipped' AND position(%(waits)s IN COALESCE(reason, '')) > 0 AS waits
          FROM migration_records
         WHERE tenant_id = %(t)s AND action IN ('skipped', 'failed')
           AND (%(k)s::text IS NULL OR kind = %(k)s) AND (%(run)s::bigint IS NULL OR migration_id = %(run)s)) AS r
"""
UNREADABLE_COUNT_SQL = """
SELECT count(*) AS n FROM migration_unreadable
 WHERE tenant_id = %(t)s AND 'failed' = ANY(%(actions)s)
   AND (%(k)s::text IS NULL OR kind IN (%(k)s, %(k)s || '_archived'))
   AND (%(run)s::bigint IS NULL OR migration_id = %(run)s)
"""
ROWS_PAGE = 2000  # rows fetched per round trip by `migrate rows`'s server-side cursor


ROW_ACTIONS = ("skipped", "waiting", "failed")  # what `migrate rows` lists: every row not written (yet)


def tenant_rows(db: Database, tenant: str, kind: str | None = None, actions: tuple[str, ...] = ROW_ACTIONS,
                run_id: int | None = None, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Every skipped, waiting or failed row of `tenant` now, for `migrate rows`: the ledger's rows whose
    action is in `actions` (one per source row: `run_id` is the run that last wrote it; "waiting" is
    a placeholder left to the catch-up's walk, `rows.WAITS_FOR_WALK`, the ledger's "skipped") and, when "failed"
    is asked for, the rows kept in migration_unreadable for want of a readable id (action "failed",
    `id` their raw key, `unreadable` True); only `kind`'s (None: every kind), only those `run_id`
    last touched (None: any run), at most `limit` (None: all). Sorted by kind, action, id (shorter
    ids first). Each {"kind", "source", "id", "action", "run_id", "reason", "deleted_at_source",
    "unreadable", "dry_run"}. Streamed through a server-side cursor, ROWS_PAGE rows a round trip, so
    a tenant with 100k failed rows is never held in memory; the connection is held until the
    iterator is exhausted or closed."""
    params = {"t": tenant, "k": kind, "actions": list(actions), "run": run_id, "limit": limit, "waits": WAITS_FOR_WALK}
    yield from stream(db, ROWS_SQL, params, page=ROWS_PAGE, name="migrate_rows")


def tenant_row_counts(db: Database, tenant: str, kind: str | None = None,
                      actions: tuple[str, ...] = ROW_ACTIONS, run_id: int | None = None) -> dict[str, int]:
    """What `tenant_rows` would yield without a limit, counted: {"skipped", "waiting", "failed" (the
    unreadable rows included), "unreadable"}."""
    params = {"t": tenant, "k": kind, "actions": list(actions), "run": run_id, "waits": WAITS_FOR_WALK}
    ledger = db.sql(ROWS_COUNT_SQL, params)[0]
    unreadable = int(db.sql(UNREADABLE_COUNT_SQL, params)[0]["n"])
    return {"skipped": int(ledger["skipped"]), "waiting": int(ledger["waiting"]),
            "failed": int(ledger["failed"]) + unreadable, "unreadable": unreadable}


def source_listing(db: Database, tenant: str, kind: str, source_id: str) -> dict[str, Any] | None:
    """What the tenant's kept listing of the source says of `source_id` for `explain`: the inventory
    (`migration_inventory`) of the latest succeeded run whose catch-up listed every id of ledger kind
    `kind` - a full run, or a sync that detects deletes; a run's inventory is kept until the tenant's
    next catch-up starts. {"run_id", "listed" (ids of the kind it listed), "has" (source_id among
    them)}, or None when no such listing is kept (a source without a catch-up, a sync listing only
    changes, a run still listing): then nothing is said of the source. Sends nothing."""
    rows = db.sql(
        "SELECT m.id AS run_id, count(*) AS listed, bool_or(i.source_id = %(id)s) AS has"
        "  FROM migration_inventory i JOIN migrations m ON m.id = i.migration_id"
        " WHERE m.tenant_id = %(t)s AND i.kind = %(k)s AND m.status = 'succeeded' AND NOT m.dry_run"
        "   AND (m.mode = 'full' OR lower(COALESCE(m.options->>'detect_deletes', 'true')) NOT IN ('0', 'false', 'no', 'off'))"
        " GROUP BY m.id ORDER BY m.id DESC LIMIT 1",
        {"t": tenant, "k": kind, "id": str(source_id)})
    return rows[0] if rows else None


def _claimed_table(db: Database, record_type: str | None) -> sql.Composable | None:
    if not record_type:
        return None
    row = db.sql("SELECT to_regclass(%(t)s)::text AS reg", {"t": record_type})
    if not row or not row[0]["reg"]:
        return None
    return sql.Identifier(*record_type.split(".", 1))


def _columns(db: Database, record_type: str) -> set[str]:
    """The column names of the table `record_type` names (resolved as `_claimed_table` does; none when
    there is no such table): one catalog read per table (information_schema.columns, asked per
    column, was a third of a small phase's checks)."""
    rows = db.sql(
        "SELECT attname::text AS name FROM pg_attribute WHERE attrelid = to_regclass(%(t)s)"
        " AND attnum > 0 AND NOT attisdropped",
        {"t": record_type},
    )
    return {r["name"] for r in rows}


def ledger_vs_target(db: Database, tenant: str, source: str, kind: str) -> dict[str, Any]:
    """The ledger's created and matched claims of one `kind` against the product rows they point at
    (the Dagster check `ledger_matches_target`): {"kind", "created", "matched", "target_rows"
    (distinct rows the created claims find), "missing" (created claims without their row),
    "shared" (rows two created claims point at), "matched_missing", "unknown_tables" (record
    types naming no table)}. Read-only; run it in a snapshot for one consistent answer."""
    out = {"kind": kind, "created": 0, "matched": 0, "target_rows": 0, "missing": 0, "shared": 0,
           "matched_missing": 0, "unknown_tables": []}
    groups = db.sql(
        "SELECT record_type, action, count(*) AS n FROM migration_records"
        " WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND action IN ('created', 'matched')"
        " GROUP BY record_type, action",
        {"t": tenant, "s": source, "k": kind},
    )
    for g in groups:
        out[g["action"]] += int(g["n"])
        table = _claimed_table(db, g["record_type"])
        if table is None:
            out["unknown_tables"].append(g["record_type"])
            continue
        q = sql.SQL(
            "SELECT count(*) AS claims, count(DISTINCT r.record_id) AS distinct_ids, count(t.id) AS existing,"
            " count(DISTINCT t.id) AS distinct_existing"
            " FROM migration_records r LEFT JOIN {table} t ON t.id = r.record_id"
            " WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = %(k)s"
            " AND r.action = %(a)s AND r.record_type = %(rt)s"
        ).format(table=table)
        row = db.sql(q, {"t": tenant, "s": source, "k": kind, "a": g["action"], "rt": g["record_type"]})[0]
        if g["action"] == "created":
            out["target_rows"] += int(row["distinct_existing"])
            out["missing"] += int(row["claims"]) - int(row["existing"])
            out["shared"] += int(row["existing"]) - int(row["distinct_existing"])
        else:
            out["matched_missing"] += int(row["claims"]) - int(row["existing"])
    return out


def duplicate_claims(db: Database, tenant: str, source: str, kinds: list[str]) -> dict[str, Any]:
    """Target rows claimed as created more than once; target rows the migration wrote without a
    claim (rows of the tenant marked with this source, or every row of a table without a `source`
    column); and target rows written twice for one source id (the Dagster check
    `no_duplicate_claims`): {"duplicates" (at most 20 {record_type, record_id, n}), "unclaimed"
    ({table: rows}), "written_twice" ({table: source ids})}. Read-only."""
    dup = db.sql(
        "SELECT record_type, record_id, count(*) AS n FROM migration_records"
        " WHERE tenant_id = %(t)s AND source = %(s)s AND kind = ANY(%(k)s) AND action = 'created'"
        " AND record_id IS NOT NULL GROUP BY record_type, record_id HAVING count(*) > 1 LIMIT 20",
        {"t": tenant, "s": source, "k": kinds},
    )
    unclaimed: dict[str, int] = {}
    twice: dict[str, int] = {}
    types = db.sql(
        "SELECT DISTINCT record_type FROM migration_records WHERE tenant_id = %(t)s AND source = %(s)s"
        " AND kind = ANY(%(k)s) AND action IN ('created', 'matched') AND record_type IS NOT NULL",
        {"t": tenant, "s": source, "k": kinds},
    )
    for t in types:
        record_type = t["record_type"]
        table = _claimed_table(db, record_type)
        columns = _columns(db, record_type) if table is not None else set()
        if "tenant_id" not in columns:
            continue
        # rows the product had before the migration carry no source: they are not ours to count
        ours = sql.SQL(" AND x.source = %(s)s") if "source" in columns else sql.SQL("")
        if "kind" in columns:  # a table shared by kinds of several phases
            ours = ours + sql.SQL(" AND x.kind = ANY(%(k)s)")
        # a set difference, not NOT EXISTS: its plan does not depend on the tables' statistics (a
        # check right after a phase wrote into fresh tables planned NOT EXISTS as a nested loop over
        # the ledger, ~0.5 s a phase on a small account with autovacuum off)
        q = sql.SQL(
            "SELECT count(*) AS n FROM (SELECT x.id FROM {table} x WHERE x.tenant_id = %(t)s{ours}"
            " EXCEPT SELECT r.record_id FROM migration_records r WHERE r.tenant_id = %(t)s"
            " AND r.record_type = %(rt)s AND r.action IN ('created', 'matched')) d"
        ).format(table=table, ours=ours)
        params = {"t": tenant, "rt": record_type, "s": source, "k": kinds}
        n = int(db.sql(q, params)[0]["n"])
        if n:
            unclaimed[record_type] = n
        if "source_id" in columns:
            per = sql.SQL(", x.kind") if "kind" in columns else sql.SQL("")
            q2 = sql.SQL(
                "SELECT count(*) AS n FROM (SELECT 1 FROM {table} x WHERE x.tenant_id = %(t)s{ours}"
                " AND x.source_id IS NOT NULL GROUP BY x.source_id{per} HAVING count(*) > 1) d"
            ).format(table=table, ours=ours, per=per)
            n2 = int(db.sql(q2, params)[0]["n"])
            if n2:
                twice[record_type] = n2
    return {"duplicates": [dict(d) for d in dup], "unclaimed": unclaimed, "written_twice": twice}


def ledger_kinds(db: Database, tenant: str) -> list[str]:
    """The kinds the ledger holds rows of for `tenant`, sorted (what `explain_row` offers when a
    row is not found)."""
    return [r["kind"] for r in db.sql(
        "SELECT DISTINCT kind FROM migration_records WHERE tenant_id = %(t)s ORDER BY kind", {"t": tenant})]


def kinds_held(conn: Database | Conn, tenant: str, source: str, kinds: Sequence[str]) -> set[str]:
    """The ledger kinds among `kinds` that `tenant`'s ledger of `source` holds an entry of (any
    action): the kinds a run of the tenant took (`writers.askable`'s earlier kinds). One index
    probe per kind."""
    if not kinds:
        return set()
    return {r["kind"] for r in conn.fetch_all("ledger_kinds_held", {"t": tenant, "s": source, "kinds": list(kinds)})}


def row_entries(db: Database, tenant: str, kind: str, source_id: str) -> list[dict[str, Any]]:
    """Every ledger entry of one source row (`kind`, `source_id` of `tenant`, from every source),
    with its run's "run_status" and "run_dry_run"; ordered by source."""
    return db.fetch_all("explain_story", {"tenant_id": tenant, "kind": kind, "source_id": str(source_id)})


CHANGED_BODIES_SQL = """
SELECT (SELECT count(*) FROM crm.emails WHERE tenant_id = %(t)s AND deleted_at_source IS NULL AND body_truncated)
         AS emails_cut,
       (SELECT count(*) FROM crm.emails WHERE tenant_id = %(t)s AND deleted_at_source IS NULL
           AND body_unavailable IS NOT NULL) AS emails_unavailable,
       (SELECT count(*) FROM crm.notes WHERE tenant_id = %(t)s AND deleted_at_source IS NULL AND content_truncated)
         AS notes_cut
"""


def changed_bodies(db: Database | Conn, tenant: str) -> dict[str, int]:
    """The tenant's live product rows imported with a body other than the source's, in rows:
    {"emails_cut": mail bodies cut at `rows.EMAIL_BODY_MAX` (`body_truncated`, migration 0009),
    "emails_unavailable": mail imported without its body, the source refusing it (403/404,
    `body_unavailable`), "notes_cut": notes cut at `rows.NOTE_CONTENT_MAX` (`content_truncated`,
    migration 0014)}. Such rows are imported, so neither skipped nor failed: only this says them."""
    row = db.sql(CHANGED_BODIES_SQL, {"t": tenant})[0]
    return {k: int(v) for k, v in row.items()}


BAD_ROWS_SQL = """
SELECT kind, count(*) FILTER (WHERE action = 'skipped' AND NOT waits) AS skipped,
       count(*) FILTER (WHERE action = 'failed') AS failed, count(*) FILTER (WHERE waits) AS waiting
  FROM (SELECT kind, action, action = 'skipped' AND position(%(waits)s IN COALESCE(reason, '')) > 0 AS waits
          FROM migration_records
         WHERE tenant_id = %(t)s AND action IN ('skipped', 'failed')
           AND (%(k)s::text[] IS NULL OR kind = ANY(%(k)s))) AS r
 GROUP BY kind
UNION ALL
SELECT kind, 0, count(*), 0 FROM migration_unreadable
 WHERE tenant_id = %(t)s AND (%(k)s::text[] IS NULL OR kind = ANY(%(k)s))
 GROUP BY kind
"""


def bad_row_counts(db: Database | Conn, tenant: str, kinds: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """The tenant's skipped, failed and waiting rows now, per kind: {kind: {"skipped", "failed",
    "waiting"}}, failed counting the rows without a readable id, waiting the placeholders left to the
    catch-up's walk (`rows.WAITS_FOR_WALK`: not skipped, the catch-up settles them); only `kinds`
    (None: every kind), kinds with none of the three left out. The same rows `migrate rows` lists
    (`tenant_rows`, every run), so the figures the UI and `migrate status` show beside success agree
    with that list."""
    out: dict[str, dict[str, int]] = {}
    for r in db.sql(BAD_ROWS_SQL, {"t": tenant, "k": list(kinds) if kinds is not None else None,
                                   "waits": WAITS_FOR_WALK}):
        got = out.setdefault(r["kind"], {"skipped": 0, "failed": 0, "waiting": 0})
        for name in got:
            got[name] += int(r[name])
    return {k: v for k, v in out.items() if any(v.values())}


BAD_ROWS_BY_RUN_SQL = """
SELECT migration_id AS run_id,
       count(*) FILTER (WHERE action = 'skipped' AND position(%(waits)s IN COALESCE(reason, '')) = 0) AS skipped,
       count(*) FILTER (WHERE action = 'skipped' AND position(%(waits)s IN COALESCE(reason, '')) > 0) AS waiting,
       count(*) FILTER (WHERE action = 'failed') AS failed
  FROM (SELECT migration_id, action, reason FROM migration_records
         WHERE tenant_id = %(t)s AND action IN ('skipped', 'failed') AND (%(k)s::text[] IS NULL OR kind = ANY(%(k)s))
        UNION ALL
        SELECT migration_id, 'failed', NULL FROM migration_unreadable
         WHERE tenant_id = %(t)s AND (%(k)s::text[] IS NULL OR kind = ANY(%(k)s))) AS r
 GROUP BY migration_id ORDER BY migration_id
"""


def bad_rows_by_run(db: Database | Conn, tenant: str, kinds: Sequence[str] | None = None) -> dict[int, dict[str, int]]:
    """The tenant's skipped, waiting and failed rows now (`bad_row_counts`' rows), per run that
    left them (the run that last wrote each ledger entry): {run_id: {"skipped", "waiting",
    "failed"}}, ascending; only `kinds` (ledger kinds; None: every kind)."""
    rows = db.sql(BAD_ROWS_BY_RUN_SQL, {"t": tenant, "k": list(kinds) if kinds is not None else None,
                                        "waits": WAITS_FOR_WALK})
    return {int(r["run_id"]): {"skipped": int(r["skipped"]), "waiting": int(r["waiting"]), "failed": int(r["failed"])}
            for r in rows}


# -- reads for a source's catch-up (the inventory it keeps while it lists) -----------------------


def mail_held(conn: Database | Conn, tenant_id: str, source: str, deals: Sequence[str]) -> dict[str, int]:
    """Per deal source id the ledger holds (of `deals`), the mail messages the product holds
    under its record: {"12": 3}; a deal the ledger lacks is absent."""
    if not deals:
        return {}
    rows = conn.fetch_all("deals_mail_held", {"t": tenant_id, "s": source, "ids": list(deals)})
    return {r["source_id"]: int(r["n"]) for r in rows}


def unseen_live(conn: Database | Conn, tenant_id: str, source: str, kind: str, run_id: int) -> list[str]:
    """A ledger kind's source ids not marked deleted (written, skipped or failed) that run
    `run_id`'s inventory did not see, ascending: the candidates of a deletion."""
    rows = conn.fetch_all("catchup_unseen_live", {"t": tenant_id, "s": source, "k": kind, "r": run_id})
    return [r["source_id"] for r in rows]


def unseen_skipped(conn: Database | Conn, tenant_id: str, source: str, kind: str, run_id: int) -> list[str]:
    """A ledger kind's skipped source ids that run `run_id`'s inventory did not see, ascending
    (a sync that lists only what changed asks them by id)."""
    rows = conn.fetch_all("catchup_unseen_skipped", {"t": tenant_id, "s": source, "k": kind, "r": run_id})
    return [r["source_id"] for r in rows]


def takeable(conn: Database | Conn, tenant_id: str, source: str, kinds: Sequence[str],
             missing_of: str | None = None, *, source_id: str | None = None) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Skipped placeholders of `kinds` whose every parent is written now (migration 0019's
    `parents`; placeholders noted before it kept none and are not found): (kind, source id,
    parents as `write.parents_json` keeps them), by kind and id. `missing_of`: only those skipped
    for a missing parent of that ledger kind; `source_id`: only that row. A skip whose reason no longer holds - the row was read
    before its parent was written - not a settled one."""
    if not kinds:
        return []
    rows = conn.fetch_all("takeable_placeholders", {"t": tenant_id, "s": source, "kinds": list(kinds),
                                                     "missing_of": missing_of, "id": source_id})
    return [(r["kind"], r["source_id"], list(r["parents"] or ())) for r in rows]


def skipped_naming(conn: Database | Conn, tenant_id: str, source: str, words: Sequence[str]) -> int:
    """How many of the tenant's skipped rows (not found deleted at the source) have any of `words`
    in their reason: the rows waiting for a list their run did not take (`skip_reason.untaken_mark`)."""
    row = conn.fetch_one("skipped_naming", {"t": tenant_id, "s": source, "words": list(words)})
    return int(row["n"]) if row else 0


def skipped_for_parent(conn: Database | Conn, tenant_id: str, source: str, kind: str, source_id: str) -> dict[str, int]:
    """Per kind, the tenant's skipped rows that missed the parent `kind` `source_id` (the parents
    they kept, migration 0019): what writing that parent would let a sync take."""
    return {r["kind"]: int(r["n"]) for r in conn.fetch_all(
        "skipped_for_parent", {"t": tenant_id, "s": source, "k": kind, "id": str(source_id)})}

