"""The write path: persons rows per second through today's per-row savepoint path (the baseline),
through a batched prototype and through COPY - with statistics fresh, and on tables whose
autovacuum is off, before and after the engine's own statistics keeper (engine_core/statistics.py).

    python bench/write_path.py [--rows 3000] [--orgs 1500] [--reps 3] [--skip-autovacuum-off]
    python bench/write_path.py --rows 20000 --orgs 4000 --reps 3     # the issue's figure

Rows: the first `--orgs` organizations and `--rows` persons of a `seed-customer` sandbox (fetched
once, no latency); a person whose organization is not among those has its org_id dropped, so every
row is imported. One thread, one database pool, pages of 500, windows of 25.

Variants (each writes the same persons for a tenant of its own, after that tenant's organizations
were loaded through the per-row path, untimed):
- `per_row`: `writers.write_page` -> `TaskContext.write_rows`: a transaction per window, a
  savepoint per row, a ledger claim per row (today's engine).
- `batched`: a prototype living in this file only: per window one multi-row INSERT of the product
  rows, one set-based ledger claim (`INSERT ... SELECT FROM unnest ... ON CONFLICT ... DO UPDATE
  ... WHERE placeholder RETURNING`; a lost claim deletes its product row: already here) and the
  checkpoint, in one transaction. Rows that are not plain (unmapped, a parent missing, a duplicate
  id in the window) go through today's per-row savepoints inside the same transaction.
- `copy`: as `batched`, the product rows written by COPY with ids drawn from the sequence first.
The ledger and product rows of the three are compared (ids aside) and must be identical.

Scenarios, each interleaved (the order rotates every round) and reported as medians:
1. statistics fresh: ANALYZE on every grown table just before each timed write, and again after
   any page that grew a table by a fifth (the keeper, checking after every page): on a server whose
   autovacuum is off, an ANALYZE taken before the write alone is the empty tables' statistics.
2. autovacuum off: a fresh database per round with autovacuum off on every table (what a server
   with autovacuum=off does) and nothing analyzed by hand; `+stats` variants run the engine's
   statistics keeper as the engine does at the organizations -> persons phase boundary
   (`at_boundary`) and its growth check after every page (`maybe_refresh`, at most every 2 s).
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from psycopg import sql  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from bench.common import Databases, Timer, interleave, median, print_ratios, ratio, sandbox, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import ledger, statistics  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.context import TaskContext  # noqa: E402
from engine_core.db import Conn  # noqa: E402
from engine_core.models import Run, Task  # noqa: E402
from engine_core.providers.pipedrive import mapping, writers  # noqa: E402
from engine_core.runlog import RunLog  # noqa: E402
from engine_core.target import crm  # noqa: E402

PAGE = 500
WORKER = "bench-write-path"
SETTINGS = Settings(heartbeat_seconds=0.0)
KIND = "persons"


# --- a run and a task to write under ------------------------------------------------------------


def new_context(db: dbmod.Database, tenant: str, kind: str, run: Run | None = None) -> TaskContext:
    if run is None:
        row = db.sql(
            "INSERT INTO migrations (tenant_id, source, source_account, plan) VALUES (%(t)s, 'pipedrive', 'bench',"
            " '[[\"organizations\"], [\"persons\"]]'::jsonb) RETURNING *", {"t": tenant})[0]
        run = Run.from_row(row)
    phase = 0 if kind == "organizations" else 1
    row = db.sql(
        "INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, locked_by, locked_at)"
        " VALUES (%(r)s, %(p)s, %(k)s, %(key)s, '{}'::jsonb, 'running', %(w)s, now()) RETURNING *",
        {"r": run.id, "p": phase, "k": kind, "key": f"{kind}:bench", "w": WORKER})[0]
    return TaskContext(db=db, run=run, task=Task.from_row(row), worker=WORKER, settings=SETTINGS, log=RunLog(run.id, row["id"]))


def pages(rows: Sequence[Any]) -> list[Sequence[Any]]:
    return [rows[i : i + PAGE] for i in range(0, len(rows), PAGE)]


# --- today's path --------------------------------------------------------------------------------


def write_per_row(ctx: TaskContext, rows: Sequence[Any], mapper: Callable[[Any], mapping.Mapped],
                  after_page: Callable[[], object] | None = None) -> None:
    for page in pages(rows):
        ctx.offset = 0  # a new page of the task
        writers.write_page(ctx, page, mapper)
        if after_page:
            after_page()


# --- the prototype: a window in set-based statements ---------------------------------------------


def _claim_window(tx: Conn, run: Run, kind: str, record_type: str, claims: list[tuple[str, int, str]]) -> set[str]:
    """One statement for the window's ledger claims, with `claim_record`'s contract: created and
    matched rows are exclusive, skipped and failed ones are placeholders taken over. Returns the
    source ids claimed."""
    rows = tx.sql(
        "INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, record_type, record_id, action)"
        " SELECT %(run)s, %(tenant)s, %(source)s, %(kind)s, u.sid, %(rt)s, u.rid, u.action"
        "   FROM unnest(%(sids)s::text[], %(rids)s::bigint[], %(actions)s::text[]) AS u(sid, rid, action)"
        " ON CONFLICT ON CONSTRAINT migration_records_once DO UPDATE"
        "    SET migration_id = EXCLUDED.migration_id, record_type = EXCLUDED.record_type,"
        "        record_id = EXCLUDED.record_id, action = EXCLUDED.action, reason = EXCLUDED.reason,"
        "        dangling = EXCLUDED.dangling, created_at = now()"
        "  WHERE migration_records.action IN ('skipped', 'failed')"
        " RETURNING source_id",
        {"run": run.id, "tenant": run.tenant_id, "source": run.source, "kind": kind, "rt": record_type,
         "sids": [c[0] for c in claims], "rids": [c[1] for c in claims], "actions": [c[2] for c in claims]},
    )
    return {r["source_id"] for r in rows}


def _matches(tx: Conn, tenant: str, source: str, plain: list[mapping.Mapped]) -> dict[str, int]:
    """`crm.match_contact` for a whole window in one query: the oldest contact of another source
    with one of the row's addresses."""
    wanted = sorted({e for m in plain for e in (crm.normal_email(x) for x in m.match_emails) if e})
    if not wanted:
        return {}
    rows = tx.sql("SELECT lower(email) AS e, min(id) AS id FROM crm.contacts WHERE tenant_id = %(t)s"
                  " AND lower(email) = ANY(%(emails)s::text[]) AND source IS DISTINCT FROM %(s)s GROUP BY 1",
                  {"t": tenant, "emails": wanted, "s": source})
    by_email = {r["e"]: int(r["id"]) for r in rows}
    out: dict[str, int] = {}
    for m in plain:
        ids = [by_email[e] for e in (crm.normal_email(x) for x in m.match_emails) if e in by_email]
        if ids:
            out[m.source_id] = min(ids)
    return out


def _insert_values(tx: Conn, table: str, rows: list[dict[str, Any]]) -> dict[str, int]:
    """One multi-row INSERT; returns source id -> new id."""
    spec = crm.TABLES[table]
    names = list(rows[0])
    stmt = sql.SQL("INSERT INTO crm.{} ({}) VALUES {} RETURNING id, source_id").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(names))) for _ in rows))
    params = [Jsonb(r[n]) if n in spec.jsonb and r[n] is not None else r[n] for r in rows for n in names]
    return {r["source_id"]: int(r["id"]) for r in tx.raw.execute(stmt, params).fetchall()}


def _copy_values(tx: Conn, table: str, rows: list[dict[str, Any]]) -> dict[str, int]:
    """COPY with ids drawn from the table's sequence first (COPY returns nothing)."""
    spec = crm.TABLES[table]
    names = list(rows[0])
    ids = [r["id"] for r in tx.sql(f"SELECT nextval(pg_get_serial_sequence('crm.{table}', 'id')) AS id"
                                   f" FROM generate_series(1, {len(rows)})")]
    stmt = sql.SQL("COPY crm.{} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, ["id", *names])))
    with tx.raw.cursor() as cur, cur.copy(stmt) as copy:
        for rid, r in zip(ids, rows):
            copy.write_row([rid, *(json.dumps(r[n]) if n in spec.jsonb and r[n] is not None else r[n] for n in names)])
    return {r["source_id"]: rid for rid, r in zip(ids, rows)}


def _by_columns(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r), []).append(r)
    return list(groups.values())


def write_set_based(ctx: TaskContext, rows: Sequence[Any], mapper: Callable[[Any], mapping.Mapped],
                    *, use_copy: bool = False, after_page: Callable[[], object] | None = None) -> None:
    """The prototype's page writer (contacts only): resolve the page's references in one query,
    then per 25-row window one transaction with set-based statements and the checkpoint."""
    run = ctx.run
    record_type = crm.TABLES["contacts"].record_type
    write_rows = _copy_values if use_copy else _insert_values
    for page in pages(rows):
        ctx.offset = 0
        prepared = [writers.Prepared.of(r, mapper) for r in page]
        with ctx.db.connection() as conn:
            found = ledger.resolve(conn, run, writers.ledger_refs(p["mapped"] for p in prepared))

        def per_row(tx: Conn, row: writers.Prepared) -> str:
            if row["error"] is not None:
                raise row["error"]
            return writers.write_mapped(tx, run, KIND, row["mapped"], found, None, on_event=ctx.stats.bump)

        for w in range(0, len(prepared), ctx.window):
            window = prepared[w : w + ctx.window]
            counts: dict[str, int] = {}
            with ctx.db.transaction() as tx:
                plain: list[mapping.Mapped] = []
                other: list[writers.Prepared] = []
                seen: set[str] = set()
                for p in window:
                    m = p["mapped"]
                    if m is None or m.table != "contacts" or m.source_id in seen or any(writers.lookup(found, r) is None for r in m.parents):
                        other.append(p)
                    else:
                        plain.append(m)
                        seen.add(m.source_id)
                for p in other:  # today's per-row savepoints for what the batch does not cover
                    outcome = ctx._write_row(tx, KIND, p, per_row)
                    counts[outcome] = counts.get(outcome, 0) + 1
                if plain:
                    matched = _matches(tx, run.tenant_id, plain[0].values["source"], plain)
                    values = [mapping.apply_links(m, {ref: writers.lookup(found, ref) for ref in m.refs()})
                              for m in plain if m.source_id not in matched]
                    inserted: dict[str, int] = {}
                    for group in _by_columns(values):  # rows without a link lack its column
                        inserted.update(write_rows(tx, "contacts", group))
                    claims = [(m.source_id, matched.get(m.source_id) or inserted[m.source_id],
                               "matched" if m.source_id in matched else "created") for m in plain]
                    won = _claim_window(tx, run, KIND, record_type, claims)
                    lost = [inserted[m.source_id] for m in plain if m.source_id not in won and m.source_id in inserted]
                    if lost:  # someone else holds these rows: our writes go, they are already here
                        tx.sql("DELETE FROM crm.contacts WHERE id = ANY(%(ids)s::bigint[])", {"ids": lost})
                    for m in plain:
                        outcome = (ledger.MATCHED if m.source_id in matched else ledger.IMPORTED) if m.source_id in won else ledger.ALREADY_HERE
                        counts[outcome] = counts.get(outcome, 0) + 1
                for k, v in counts.items():
                    ctx.stats.bump("seen", v)
                    ctx.stats.bump(k, v)
                ctx.checkpoint(tx, w + len(window))
        if after_page:
            after_page()


# --- one measurement -----------------------------------------------------------------------------


class Data:
    def __init__(self, orgs: list[dict[str, Any]], persons: list[dict[str, Any]]) -> None:
        self.orgs = orgs
        known = {o["id"] for o in orgs}
        # every person imported: a person whose organization is not loaded loses the link
        self.persons = [p if p.get("org_id") in known else {**p, "org_id": None} for p in persons]


def analyze_all(db: dbmod.Database) -> None:
    for g in statistics.growth(db):
        db.sql(f'ANALYZE "{g.schema}"."{g.name}"')


def one_write(db: dbmod.Database, data: Data, variant: str, keeper: statistics.Statistics | None,
              fresh_stats: bool) -> tuple[float, str]:
    """Load the tenant's organizations (untimed), then time its persons; returns (rows/s, tenant)."""
    tenant = f"bench-{variant.split()[0]}-{uuid.uuid4().hex[:6]}"
    book = mapping.FieldBook()
    orgs_ctx = new_context(db, tenant, "organizations")
    write_per_row(orgs_ctx, data.orgs, lambda r: mapping.map_organization(r, tenant, book))
    if keeper is not None:
        keeper.at_boundary()  # what the barrier's winner does between the two phases
    if fresh_stats:
        analyze_all(db)
    ctx = new_context(db, tenant, KIND, orgs_ctx.run)
    mapper = lambda r: mapping.map_person(r, tenant, book)  # noqa: E731
    after = keeper.maybe_refresh if keeper is not None else None
    t = Timer()
    if variant.startswith("per_row"):
        write_per_row(ctx, data.persons, mapper, after)
    elif variant.startswith("batched"):
        write_set_based(ctx, data.persons, mapper, after_page=after)
    else:
        write_set_based(ctx, data.persons, mapper, use_copy=True, after_page=after)
    return len(data.persons) / t.seconds, tenant


def snapshot(db: dbmod.Database, tenant: str) -> tuple[list, list]:
    """A tenant's ledger and contacts, ids aside (links as the linked row's source id)."""
    ledger_rows = db.sql(
        "SELECT r.kind, r.source_id, r.record_type, r.action, r.reason, r.dangling,"
        "       COALESCE(c.source_id, co.source_id) AS record_source_id"
        "  FROM migration_records r"
        "  LEFT JOIN crm.contacts c ON r.kind = 'persons' AND c.id = r.record_id AND c.tenant_id = r.tenant_id"
        "  LEFT JOIN crm.companies co ON r.kind = 'organizations' AND co.id = r.record_id AND co.tenant_id = r.tenant_id"
        " WHERE r.tenant_id = %(t)s ORDER BY r.kind, r.source_id", {"t": tenant})
    contacts = db.sql(
        "SELECT c.source_id, to_jsonb(c) - 'id' - 'tenant_id' - 'created_at' - 'company_id' - 'owner_id' AS v,"
        "       co.source_id AS company"
        "  FROM crm.contacts c LEFT JOIN crm.companies co ON co.id = c.company_id"
        " WHERE c.tenant_id = %(t)s ORDER BY c.source_id", {"t": tenant})
    return ledger_rows, contacts


def fetch_data(n_orgs: int, n_persons: int) -> Data:
    with sandbox("seed-customer", latency="none", burst_limit=1_000_000) as sb:
        orgs = sb.list_v2("/api/v2/organizations", n_orgs, sort_by="id")
        persons = sb.list_v2("/api/v2/persons", n_persons, sort_by="id")
    return Data(orgs, persons)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3000, help="persons rows written per measurement")
    parser.add_argument("--orgs", type=int, default=1500, help="organizations loaded first (untimed)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-autovacuum-off", action="store_true")
    args = parser.parse_args(argv)

    data = fetch_data(args.orgs, args.rows)
    dbs = Databases("write_path")
    print(f"write path: {len(data.persons)} persons after {len(data.orgs)} organizations, one thread; "
          f"{server_facts(dbs.server)}", flush=True)
    ok = True
    try:
        # 1. statistics fresh: one database, a tenant per measurement, ANALYZE before each
        db = dbmod.Database(dbs.new(), max_size=4)
        tenants: dict[str, str] = {}

        def fresh(variant: str, r: int) -> float:
            # fresh whatever the server's autovacuum: analyzed before, and after every page that grew a table by a fifth
            keeper = statistics.Statistics(db, check_seconds=0)
            rps, tenant = one_write(db, data, variant, keeper, fresh_stats=True)
            tenants.setdefault(variant, tenant)
            return rps

        print("statistics fresh (rows/s):", flush=True)
        fresh_runs = interleave(["per_row", "batched", "copy"], args.reps, fresh)
        base = snapshot(db, tenants["per_row"])
        for variant in ("batched", "copy"):
            same = snapshot(db, tenants[variant]) == base
            ok &= same
            print(f"  {variant}: ledger and contacts identical to per_row's: {'yes' if same else 'NO'}")
        db.close()

        off_runs: dict[str, list[float]] = {}
        if not args.skip_autovacuum_off:
            # 2. autovacuum off: a fresh database per measurement, nothing analyzed by hand
            def off(variant: str, r: int) -> float:
                odb = dbmod.Database(dbs.new(autovacuum=False), max_size=4)
                try:
                    keeper = statistics.Statistics(odb) if variant.endswith("+stats") else None
                    return one_write(odb, data, variant, keeper, fresh_stats=False)[0]
                finally:
                    odb.close()

            print("autovacuum off (rows/s):", flush=True)
            off_runs = interleave(["per_row", "per_row +stats", "batched", "batched +stats"], args.reps, off)
    finally:
        dbs.close()

    m = {k: median(v) for k, v in fresh_runs.items()}
    lines = [
        ("per_row rows/s, statistics fresh", m["per_row"], "today's path"),
        ("batched / per_row, statistics fresh", ratio(m["batched"], m["per_row"]), f"{m['batched']:.0f} rows/s; target >= 4"),
        ("copy / per_row, statistics fresh", ratio(m["copy"], m["per_row"]), f"{m['copy']:.0f} rows/s"),
    ]
    if off_runs:
        o = {k: median(v) for k, v in off_runs.items()}
        lines += [
            ("per_row, autovacuum off / fresh", ratio(o["per_row"], m["per_row"]), f"{o['per_row']:.0f} rows/s, no keeper"),
            ("per_row +stats, autovacuum off / fresh", ratio(o["per_row +stats"], m["per_row"]), f"{o['per_row +stats']:.0f} rows/s, statistics.py"),
            ("batched, autovacuum off / fresh", ratio(o["batched"], m["batched"]), f"{o['batched']:.0f} rows/s, no keeper"),
            ("batched +stats, autovacuum off / fresh", ratio(o["batched +stats"], m["batched"]), f"{o['batched +stats']:.0f} rows/s; target >= 1/1.5 = 0.67"),
        ]
    lines.append(("identical ledger and product rows (1 = yes)", float(ok), "batched and copy vs per_row"))
    print_ratios(f"write path, {len(data.persons)} persons, medians of {args.reps}", lines)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
