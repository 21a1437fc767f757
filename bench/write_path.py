"""The write path: persons rows per second through the per-row savepoint path (the baseline), through
the engine's optimistic windows (batched, copy, claimed) - with statistics fresh, and on tables whose
autovacuum is off, before and after the engine's own statistics keeper (engine_core/statistics.py).

    python bench/write_path.py [--rows 3000] [--orgs 1500] [--reps 3] [--skip-autovacuum-off]
    python bench/write_path.py --rows 20000 --orgs 4000 --reps 3     # the issue's figure

Rows: the first `--orgs` organizations and `--rows` persons of a `seed-customer` sandbox (fetched
once, no latency); a person whose organization is not among those has its org_id dropped, so every
row is imported. One thread, one database pool, pages of 500, windows of 25.

Variants (each writes the same persons for a tenant of its own, after that tenant's organizations
were loaded through the per-row path, untimed):
- `per_row`: `writers.write_page(optimistic=False)` -> `TaskContext.write_rows`: a transaction per
  window, a savepoint per row, a ledger claim per row (the engine before issue 11, kept as the
  baseline).
- `batched`: the engine's optimistic windows (`writers.write_page` -> `engine_core/write.py`) with
  `write.ROWS = "insert"`: per window one set-based match query, one multi-row INSERT of the
  product rows, one ledger claim (`claim_records`: `INSERT ... SELECT FROM unnest ... ON CONFLICT
  ... DO UPDATE ... WHERE placeholder RETURNING`; a lost claim deletes its product row and the row
  is seen again per row) and the checkpoint, in one transaction. Rows that are not plain
  (unmapped, a parent missing, held in the ledger, a duplicate id in the window) go through the
  per-row savepoints in the same transaction.
- `copy`: the same with `write.ROWS = "copy"`: the product rows written by COPY, ids drawn from the
  sequence first.
- `claimed`: the engine's path as it runs (`write.ROWS = "claimed"`, the default): the claim
  statement inserts the product rows of the claims that win (ids, claim and insert in one
  statement; nothing to delete).
The ledger and product rows of the four are compared (ids aside) and must be identical.

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
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.common import Databases, Timer, interleave, median, print_ratios, ratio, sandbox, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import statistics, write  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.context import TaskContext  # noqa: E402
from engine_core.models import Run, Task  # noqa: E402
from engine_core.providers.pipedrive import fields, mappers, mapping, writers  # noqa: E402
from engine_core.runlog import RunLog  # noqa: E402

PAGE = 500
# the optimistic variants and how each writes its product rows (`write.ROWS`)
ROWS_OF = {"batched": "insert", "copy": "copy", "claimed": "claimed"}
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
                  after_page: Callable[[], object] | None = None, *, optimistic: bool = False) -> None:
    """Pages through `writers.write_page`: the per-row path (the baseline), or with `optimistic`
    the engine's optimistic windows."""
    for page in pages(rows):
        ctx.offset = 0  # a new page of the task
        writers.write_page(ctx, page, mapper, optimistic=optimistic)
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
    book = fields.FieldBook()
    orgs_ctx = new_context(db, tenant, "organizations")
    write_per_row(orgs_ctx, data.orgs, lambda r: mappers.map_organization(r, tenant, book))  # the baseline's way
    if keeper is not None:
        keeper.at_boundary()  # what the barrier's winner does between the two phases
    if fresh_stats:
        analyze_all(db)
    ctx = new_context(db, tenant, KIND, orgs_ctx.run)
    mapper = lambda r: mappers.map_person(r, tenant, book)  # noqa: E731
    after = keeper.maybe_refresh if keeper is not None else None
    t = Timer()
    if variant.startswith("per_row"):
        write_per_row(ctx, data.persons, mapper, after)
    else:
        default = write.ROWS
        write.ROWS = ROWS_OF[variant.split()[0]]
        try:
            write_per_row(ctx, data.persons, mapper, after, optimistic=True)
        finally:
            write.ROWS = default
    return len(data.persons) / t.seconds, tenant


def snapshot(db: dbmod.Database, tenant: str) -> tuple[list, list]:
    """A tenant's ledger and contacts, ids aside (links as the linked row's source id)."""
    ledger_rows = db.sql(
        "SELECT r.kind, r.source_id, r.record_type, r.action, r.reason, r.dangling, r.deleted_at_source, r.source_version,"
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
        fresh_runs = interleave(["per_row", "batched", "copy", "claimed"], args.reps, fresh)
        base = snapshot(db, tenants["per_row"])
        for variant in ("batched", "copy", "claimed"):
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
            off_runs = interleave(["per_row", "per_row +stats", "claimed", "claimed +stats"], args.reps, off)
    finally:
        dbs.close()

    m = {k: median(v) for k, v in fresh_runs.items()}
    lines = [
        ("per_row rows/s, statistics fresh", m["per_row"], "today's path"),
        ("batched / per_row, statistics fresh", ratio(m["batched"], m["per_row"]), f"{m['batched']:.0f} rows/s; target >= 4"),
        ("copy / per_row, statistics fresh", ratio(m["copy"], m["per_row"]), f"{m['copy']:.0f} rows/s"),
        ("claimed / per_row, statistics fresh", ratio(m["claimed"], m["per_row"]), f"{m['claimed']:.0f} rows/s (the engine's default)"),
        ("claimed / copy, statistics fresh", ratio(m["claimed"], m["copy"]), "the claim inserts vs COPY + claim"),
    ]
    if off_runs:
        o = {k: median(v) for k, v in off_runs.items()}
        lines += [
            ("per_row, autovacuum off / fresh", ratio(o["per_row"], m["per_row"]), f"{o['per_row']:.0f} rows/s, no keeper"),
            ("per_row +stats, autovacuum off / fresh", ratio(o["per_row +stats"], m["per_row"]), f"{o['per_row +stats']:.0f} rows/s, statistics.py"),
            ("claimed, autovacuum off / fresh", ratio(o["claimed"], m["claimed"]), f"{o['claimed']:.0f} rows/s, no keeper"),
            ("claimed +stats, autovacuum off / fresh", ratio(o["claimed +stats"], m["claimed"]), f"{o['claimed +stats']:.0f} rows/s; target >= 1/1.5 = 0.67"),
        ]
    lines.append(("identical ledger and product rows (1 = yes)", float(ok), "batched, copy and claimed vs per_row"))
    print_ratios(f"write path, {len(data.persons)} persons, medians of {args.reps}", lines)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
