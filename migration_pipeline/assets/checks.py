"""Per-phase asset checks, per tenant partition, read from the ledger and the target tables.

* `ledger_matches_target`: for every kind of the phase, the ledger's created claims = the target
  rows they point at (each claim has its own row, none missing, none shared), and matched claims
  point at rows that exist.
* `no_duplicate_claims`: no target row is claimed as created by two ledger entries, no target row
  the migration wrote for the tenant is missing its claim (a write outside the ledger), and no
  source id was written twice.

* `kinds_add_up` (issue 8, "completeness is checked, not assumed"): the engine's completeness
  verdict for the phase in the tenant's latest run (`engine_core.rollup.completeness`): rows seen =
  rows accounted for, ledger claims = rows counted as written, rows seen = the source's own count
  where a discovery task recorded one. The run's catch-up (issue 9) writes rows of many kinds; they
  count for their kinds' phases (`KindRollup.caught_up`), so a correct run on a changing account
  passes. Fails (severity ERROR) naming each kind that does not add up.

* `matches_source` (issue 9, "a proof from the source"): the phase's kinds proved against the source
  (`engine_core.verify`): the source's ids per kind by the cheapest listing against the ledger and
  the product's rows; every difference named (missing, extra, duplicated, stale version) with the
  requests and tokens it spent. It spends source tokens, so it is opt-in: not blocking, not in the
  tenant or sync job, and skipped (no result, no request) by any run that materialises assets -
  "Materialize all" on the asset graph puts every check of the selected assets in its run
  (`proof_requested`). Run it on its own from the check's page, or through the `verify_tenant`
  job's launchpad on a tenant partition (every phase; its evaluations land on these checks). Built
  only for a provider that can list its ids (`Provider.source_ids`).

The three ledger checks are evaluated by the phase asset's own op right after it materialises
(`ledger_check_specs`, phases._phase_asset), and alone when a run selects only them.

Read-only. The ledger names each claim's target table in `record_type` (the engine's contract for
every writer); the checks resolve it with `to_regclass` and never interpolate unchecked names.
A phase's three ledger checks read one snapshot (`snapshot`: a REPEATABLE READ, READ ONLY
transaction): drainer runs of the tenant (and other launches on the same engine run) go on with
the next phases while a phase's checks run, and the catch-up writes rows of earlier phases' kinds;
counts read by separate statements could then disagree with each other.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster import PreviewWarning
from dagster import (AssetCheckExecutionContext, AssetCheckKey, AssetCheckResult, AssetCheckSeverity, AssetChecksDefinition,
                     AssetCheckSpec, Failure, MetadataValue, multi_asset_check)
from psycopg import sql

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.db import Conn, Database
from engine_core.errors import RunNotFound
from engine_core.providers.registry import provider_for
from engine_core.source import catchup_kind
from migration_pipeline.assets.specs import PhaseSpec, phase_specs
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, SourceResource

MATCHES_SOURCE = "matches_source"


class Snapshot:
    """One transaction that reads one snapshot of the database, with the reading half of
    `Database`'s interface (`connection`, `transaction`, `fetch_one`, `fetch_all`, `sql`,
    `execute`), so the checks and the engine's read functions (`runs.latest_run`,
    `rollup.rollup`) take it in the Database's place. Made by `snapshot`."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        yield self.conn

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        with self.conn.transaction():  # a savepoint inside the snapshot's transaction
            yield self.conn

    def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        return self.conn.execute(name, params)

    def fetch_one(self, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        return self.conn.fetch_one(name, params)

    def fetch_all(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.conn.fetch_all(name, params)

    def sql(self, statement: str, params: dict[str, Any] | tuple | None = None) -> list[dict[str, Any]]:
        return self.conn.sql(statement, params)


@contextmanager
def snapshot(db: Database) -> Iterator[Snapshot]:
    """A REPEATABLE READ, READ ONLY transaction on one pooled connection: every statement in it
    sees the same committed state (Postgres: the snapshot of its first query), whatever commits
    meanwhile. Writing in it raises."""
    with db.transaction() as tx:
        tx.sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield Snapshot(tx)


def _table(db: Database, record_type: str | None) -> sql.Composable | None:
    if not record_type:
        return None
    row = db.sql("SELECT to_regclass(%(t)s)::text AS reg", {"t": record_type})
    if not row or not row[0]["reg"]:
        return None
    return sql.Identifier(*record_type.split(".", 1))


def _columns(db: Database, record_type: str) -> set[str]:
    """The column names of the table `record_type` names (resolved as `_table` does; none when
    there is no such table): one catalog read per table (information_schema.columns, asked per
    column, was a third of a small phase's checks)."""
    rows = db.sql(
        "SELECT attname::text AS name FROM pg_attribute WHERE attrelid = to_regclass(%(t)s)"
        " AND attnum > 0 AND NOT attisdropped",
        {"t": record_type},
    )
    return {r["name"] for r in rows}


def ledger_vs_target(db: Database, tenant: str, source: str, kind: str) -> dict[str, Any]:
    """Created and matched claims of one kind against the target rows they point at."""
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
        table = _table(db, g["record_type"])
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
        with db.connection() as c:
            row = c.raw.execute(q, {"t": tenant, "s": source, "k": kind, "a": g["action"], "rt": g["record_type"]}).fetchone()
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
    column); and target rows written twice for one source id."""
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
        table = _table(db, record_type)
        columns = _columns(db, record_type) if table is not None else set()
        if "tenant_id" not in columns:
            continue
        # rows the product had before the migration carry no source: they are not ours to count
        ours = sql.SQL(" AND x.source = %(s)s") if "source" in columns else sql.SQL("")
        if "kind" in columns:  # a table shared by kinds of several phases
            ours = ours + sql.SQL(" AND x.kind = ANY(%(k)s)")
        # a set difference, not NOT EXISTS: its plan does not depend on the tables' statistics (a
        # check right after a phase wrote into fresh tables planned NOT EXISTS as a nested loop over
        # the ledger, ~0.5 s a phase on a small account with autovacuum off; issue 11)
        q = sql.SQL(
            "SELECT count(*) AS n FROM (SELECT x.id FROM {table} x WHERE x.tenant_id = %(t)s{ours}"
            " EXCEPT SELECT r.record_id FROM migration_records r WHERE r.tenant_id = %(t)s"
            " AND r.record_type = %(rt)s AND r.action IN ('created', 'matched')) d"
        ).format(table=table, ours=ours)
        params = {"t": tenant, "rt": record_type, "s": source, "k": kinds}
        with db.connection() as c:
            n = int(c.raw.execute(q, params).fetchone()["n"])
            if n:
                unclaimed[record_type] = n
            if "source_id" in columns:
                per = sql.SQL(", x.kind") if "kind" in columns else sql.SQL("")
                q2 = sql.SQL(
                    "SELECT count(*) AS n FROM (SELECT 1 FROM {table} x WHERE x.tenant_id = %(t)s{ours}"
                    " AND x.source_id IS NOT NULL GROUP BY x.source_id{per} HAVING count(*) > 1) d"
                ).format(table=table, ours=ours, per=per)
                n2 = int(c.raw.execute(q2, params).fetchone()["n"])
                if n2:
                    twice[record_type] = n2
    return {"duplicates": [dict(d) for d in dup], "unclaimed": unclaimed, "written_twice": twice}


def ledger_check(db: Database, tenant: str, source: str, kinds: list[str]) -> tuple[bool, dict[str, Any]]:
    per_kind = [ledger_vs_target(db, tenant, source, k) for k in kinds]
    passed = all(p["created"] == p["target_rows"] and not p["missing"] and not p["shared"]
                 and not p["matched_missing"] and not p["unknown_tables"] for p in per_kind)
    md: dict[str, Any] = {}
    for p in per_kind:
        md[f"{p['kind']}/ledger_created"] = MetadataValue.int(p["created"])
        md[f"{p['kind']}/ledger_matched"] = MetadataValue.int(p["matched"])
        md[f"{p['kind']}/target_rows"] = MetadataValue.int(p["target_rows"])
        if p["missing"] or p["shared"] or p["matched_missing"] or p["unknown_tables"]:
            md[f"{p['kind']}/problems"] = MetadataValue.json(
                {k: p[k] for k in ("missing", "shared", "matched_missing", "unknown_tables")})
    return passed, md


def duplicates_check(db: Database, tenant: str, source: str, kinds: list[str]) -> tuple[bool, dict[str, Any]]:
    found = duplicate_claims(db, tenant, source, kinds)
    passed = not found["duplicates"] and not found["unclaimed"] and not found["written_twice"]
    return passed, {
        "duplicate_claims": MetadataValue.int(len(found["duplicates"])),
        "unclaimed_target_rows": MetadataValue.int(sum(found["unclaimed"].values())),
        "source_ids_written_twice": MetadataValue.int(sum(found["written_twice"].values())),
        "details": MetadataValue.json({"duplicates": found["duplicates"][:5], "unclaimed": found["unclaimed"],
                                       "written_twice": found["written_twice"]}),
    }


def completeness_check(db: Database, tenant: str, source: str, spec: PhaseSpec) -> tuple[bool, dict[str, Any]]:
    """The engine's completeness verdict for this phase in the tenant's latest run."""
    try:
        run = runs.latest_run(db, tenant, source)
    except RunNotFound:
        return True, {"note": MetadataValue.text("no run of this tenant yet")}
    phase = spec.run_phase(run)
    if phase is None:
        return True, {"note": MetadataValue.text(f"{', '.join(spec.kinds)} not in this run's plan")}
    r = rollups.rollup(db, run.id)
    c = r.phase_completeness(phase)
    md: dict[str, Any] = {"engine_run_id": MetadataValue.int(run.id)}
    if c is None:
        md["note"] = MetadataValue.text(f"phase {phase + 1} of {run.name} has not closed yet")
        return True, md
    for kind, figures in c["kinds"].items():
        md[f"{kind}/seen"] = MetadataValue.int(int(figures["seen"]))
        md[f"{kind}/accounted"] = MetadataValue.int(int(figures["accounted"]))
        if figures["source_total"] is not None:
            md[f"{kind}/source_total"] = MetadataValue.int(int(figures["source_total"]))
    md["stats_written"] = MetadataValue.int(int(c["stats_written"]))
    if c["ledger_written"] is not None:
        md["ledger_written"] = MetadataValue.int(int(c["ledger_written"]))
    if c["problems"]:
        md["problems"] = MetadataValue.md("\n".join(f"- {p}" for p in c["problems"]))
    return bool(c["complete"]), md


LEDGER_MATCHES_TARGET = "ledger_matches_target"
NO_DUPLICATE_CLAIMS = "no_duplicate_claims"
KINDS_ADD_UP = "kinds_add_up"


def ledger_check_specs(spec: PhaseSpec) -> list[AssetCheckSpec]:
    """The phase's three ledger checks, each its own AssetCheckSpec on the phase's tenant partitions
    (the UI lists, selects and shows them one by one). They are evaluated by the phase asset's own op
    right after it materialises (phases._phase_asset; issue 11: one step per phase, not two), and on
    their own when a run selects only them."""
    kinds = list(spec.kinds)
    with warnings.catch_warnings():
        # partitioned asset checks are a preview feature in 1.13; a per-tenant check needs them
        warnings.simplefilter("ignore", PreviewWarning)
        return [
            AssetCheckSpec(LEDGER_MATCHES_TARGET, asset=spec.key, partitions_def=tenants,
                           description=f"Ledger ids = target rows, per kind ({', '.join(kinds)})."),
            AssetCheckSpec(NO_DUPLICATE_CLAIMS, asset=spec.key, partitions_def=tenants,
                           description="No target row claimed twice or written without its claim; no source id written twice."),
            AssetCheckSpec(KINDS_ADD_UP, asset=spec.key, partitions_def=tenants,
                           description="Rows seen = rows accounted for = ledger claims, and = the source's own count "
                                       "where it gives one (the engine's completeness check at phase close)."),
        ]


def evaluate_ledger_checks(db: Database, tenant: str, spec: PhaseSpec, selected: set[str]) -> list[AssetCheckResult]:
    """The selected ones of the phase's three ledger checks (names: LEDGER_MATCHES_TARGET,
    NO_DUPLICATE_CLAIMS, KINDS_ADD_UP), all read from one snapshot (`snapshot`): the engine may be
    writing meanwhile (the next phases, the catch-up's rows of this phase's kinds)."""
    kinds = list(spec.kinds)
    results = []
    with snapshot(db) as snap:
        if LEDGER_MATCHES_TARGET in selected:
            passed, md = ledger_check(snap, tenant, spec.source, kinds)
            results.append(AssetCheckResult(asset_key=spec.key, check_name=LEDGER_MATCHES_TARGET, passed=passed,
                                            metadata=md))
        if NO_DUPLICATE_CLAIMS in selected:
            passed, md = duplicates_check(snap, tenant, spec.source, kinds)
            results.append(AssetCheckResult(asset_key=spec.key, check_name=NO_DUPLICATE_CLAIMS, passed=passed,
                                            metadata=md))
        if KINDS_ADD_UP in selected:
            passed, md = completeness_check(snap, tenant, spec.source, spec)
            results.append(AssetCheckResult(asset_key=spec.key, check_name=KINDS_ADD_UP, passed=passed, metadata=md,
                                            severity=AssetCheckSeverity.ERROR))
    return results


def source_check(db: Database, provider: Any, tenant: str, spec: PhaseSpec, settings: Any = None) -> tuple[bool, dict[str, Any]]:
    """`engine_core.verify` for the phase's kinds: (passed, metadata: per kind the source, ledger
    and product counts and each difference's count, the differences' ids (capped) in markdown, the
    requests and tokens spent)."""
    from engine_core.verify import verify

    try:
        result = verify(db, provider, tenant, settings, kinds=list(spec.kinds))
    except RunNotFound:
        return True, {"note": MetadataValue.text(f"tenant {tenant!r} has no {spec.source} run yet: nothing to prove")}
    md: dict[str, Any] = {
        "requests": MetadataValue.int(result.requests),
        "tokens": MetadataValue.int(result.tokens),
        "seconds": MetadataValue.float(round(result.seconds, 2)),
        "differences": MetadataValue.int(result.differences),
    }
    for k in result.kinds:
        if not k.checked:
            md[f"{k.kind}/not_checked"] = MetadataValue.text(k.note)
            continue
        for name in ("source", "ledger", "product", "missing", "extra", "duplicated", "stale"):
            value = getattr(k, name)
            md[f"{k.kind}/{name}"] = MetadataValue.int(len(value) if isinstance(value, list) else int(value))
    md["verdict"] = MetadataValue.md("\n".join(f"- {line.strip()}" for line in result.lines()))
    return result.passed, md


def require_tenant(context: Any) -> None:
    """Fail the step in one line when its run has no tenant partition: every phase asset and check
    is per tenant, and Dagster's checks tab launches "Execute" with none (a fresh user's run failed with
    DagsterInvariantViolationError's "Cannot access partition_key for a non-partitioned run")."""
    if not context.has_partition_key:
        raise Failure(description="no tenant partition: the phase assets and their checks are per tenant - launch "
                                  "this with a tenant partition (the asset's Materialize, or the launchpad's "
                                  "partition), or `migrate verify TENANT`", allow_retries=False)


def require_run(db: Database, tenant: str, spec: PhaseSpec) -> None:
    """Fail the step in one line when the tenant has no run of the phase's source: its ledger checks,
    evaluated on their own, would compare an empty ledger with empty tables and pass 0 = 0 on a phase
    that was never migrated (a fresh user's find). Called only where the checks run without the phase
    being materialised in the same step."""
    try:
        runs.latest_run(db, tenant, spec.source)
    except RunNotFound:
        raise Failure(description=f"tenant {tenant!r} has no {spec.source} run: {spec.key.to_user_string()} was never "
                                  "materialised for it, so its ledger checks have nothing to check - materialise "
                                  "the phase first", allow_retries=False) from None


def can_list_ids(source: str) -> bool:
    """Whether the source's provider lists its ids (`Provider.source_ids`): the proof needs it."""
    try:
        return callable(getattr(provider_for(source), "source_ids", None))
    except Exception:  # noqa: BLE001 - a provider that does not load has no proof either
        return False


def proof_requested(run: Any, key: AssetCheckKey) -> bool:
    """Whether a Dagster run asked for the proof `key` on its own: it materialises no asset and
    either its check selection names the check (a launch of checks alone: Dagster stores its asset
    selection as None, a fresh user found - the proof had been skipped there) or its asset selection
    is given and empty with no check selection (a job of checks).

    "Materialize all" on the asset graph (and a backfill) puts every check of the selected assets in
    the run, `matches_source` included; a launch of `__ASSET_JOB` with no selection runs every asset
    and check. The proof spends source tokens, so those runs skip it (issue 10: a plain
    materialize-all must not call the source). The `verify_tenant` job is the other way in (jobs.py)."""
    assets = getattr(run, "asset_selection", None)
    checks = getattr(run, "asset_check_selection", None)
    if assets:  # it materialises assets
        return False
    return assets is not None if checks is None else key in checks


def _source_check_for(spec: PhaseSpec) -> AssetChecksDefinition:
    key = AssetCheckKey(spec.key, MATCHES_SOURCE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreviewWarning)

        # A subsettable multi-asset check so that its result is optional: in a run that did not ask
        # for it alone, the op yields nothing and Dagster records the check as skipped (no result,
        # no tokens spent) instead of a pass or a failure it never evaluated.
        @multi_asset_check(
            name=f"{spec.key.to_python_identifier()}_{MATCHES_SOURCE}",
            specs=[AssetCheckSpec(MATCHES_SOURCE, asset=spec.key, blocking=False, partitions_def=tenants,
                                  description=(f"The source's ids of {', '.join(spec.kinds)} (cheapest listing) = "
                                               "the ledger = the product's rows: names every missing, extra, "
                                               "duplicated and stale row, and the requests and tokens it spent. "
                                               "Spends source tokens, so it runs only when asked for on its own "
                                               "(the verify_tenant job on a tenant partition): a materialize-all skips it, and "
                                               "Dagster lists it as skipped after such a run even when an "
                                               "earlier verify_tenant run passed it (its history shows both)."))],
            can_subset=True,
        )
        def matches_source(context: AssetCheckExecutionContext, database: MigrationDatabase, source: SourceResource,
                           lane: LaneSettings):
            require_tenant(context)
            if not proof_requested(context.run, key):
                context.log.info(f"{MATCHES_SOURCE} of {spec.key.to_user_string()} skipped: it spends source tokens "
                                 "and runs only on its own (the verify_tenant job on a tenant partition)")
                return
            passed, md = source_check(database.database(), source.provider(), context.partition_key, spec,
                                      lane.engine_settings())
            yield AssetCheckResult(asset_key=spec.key, check_name=MATCHES_SOURCE, passed=passed, metadata=md,
                                   severity=AssetCheckSeverity.ERROR)

    return matches_source


def build_source_checks(source: str, phases: list[list[str]] | None = None) -> list[AssetChecksDefinition]:
    """`matches_source` per phase asset, for a provider that can list its ids (else none)."""
    return [_source_check_for(spec) for spec in proof_specs(source, phases)]


def proof_specs(source: str, phases: list[list[str]] | None = None) -> list[PhaseSpec]:
    """The phases `matches_source` proves: every phase with a data kind (not the catch-up), for a
    provider that can list its ids; none otherwise."""
    if not can_list_ids(source):
        return []
    skip = catchup_kind(provider_for(source))  # the catch-up phase has no kind of its own to prove
    return [spec for spec in phase_specs(source, phases) if set(spec.kinds) - {skip}]
