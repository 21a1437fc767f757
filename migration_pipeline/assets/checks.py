"""Per-phase asset checks, per tenant partition, read from the ledger and the target tables.

* `ledger_matches_target`: for every kind of the phase, the ledger's created claims = the target
  rows they point at (each claim has its own row, none missing, none shared), and matched claims
  point at rows that exist.
* `no_duplicate_claims`: no target row is claimed as created by two ledger entries, no target row
  the migration wrote for the tenant is missing its claim (a write outside the ledger), and no
  source id was written twice.

* `kinds_add_up` ("completeness is checked, not assumed"): the engine's completeness
  verdict for the phase in the tenant's latest run (`engine_core.rollup.completeness`): rows seen =
  rows accounted for, ledger claims = rows counted as written, rows seen = the source's own count
  where a discovery task recorded one. The run's catch-up writes rows of many kinds; they
  count for their kinds' phases (`KindRollup.caught_up`), so a correct run on a changing account
  passes. Fails (severity ERROR) naming each kind that does not add up.

* `all_rows_landed` ("every row accounted for"): fails (severity WARN) when the tenant has skipped
  or failed rows of the phase's kinds (`landed_check`), so bad rows show where success does. A row a
  walk left to the catch-up's walk (`waiting`) is accounted for at its phase's close - the catch-up
  settles it; the catch-up phase's own check fails while any row of the tenant still waits.

* `matches_source` ("a proof from the source"): the phase's kinds proved against the source
  (`engine_core.verify`): the source's ids per kind by the cheapest listing against the ledger and
  the product's rows; every difference named (missing, extra, duplicated, stale version) with the
  requests and tokens it spent. It spends source tokens, so it is opt-in: not blocking, not in the
  tenant or sync job, and not run (no request) by any run that materialises assets - "Materialize
  all" on the asset graph puts every check of the selected assets in its run (`proof_requested`);
  such a run records it not passed (WARN) saying it was not run and how to run it
  (`proof_not_run`), not Skipped. Run it through the `verify_tenant` job's launchpad on a tenant
  partition (every phase; its evaluations land on these checks) or `migrate verify`. Built only for
  a provider that can list its ids (`Provider.source_ids`).

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
from typing import Any

from dagster import PreviewWarning
from dagster import (AssetCheckEvaluation, AssetCheckExecutionContext, AssetCheckKey, AssetCheckResult, AssetCheckSeverity,
                     AssetChecksDefinition, AssetCheckSpec, AssetRecordsFilter, DagsterEventType, Failure,
                     MetadataValue, multi_asset_check)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.db import Database, snapshot
from engine_core.errors import ConfigError, RunNotFound
from engine_core.ledger_reads import bad_row_counts, duplicate_claims, ledger_vs_target
from engine_core.providers.registry import provider_for
from engine_core.source import catchup_kind
from engine_core.verify import left_out_kinds, verify
from migration_pipeline.assets.cancel import cancel_this_run
from migration_pipeline.assets.metadata import not_planned_entries
from migration_pipeline.assets.proof_not_run import how_to_prove, not_run_here
from migration_pipeline.assets.specs import PhaseSpec, phase_specs
from migration_pipeline.launch.checks import check_tenant
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, SourceResource

MATCHES_SOURCE = "matches_source"


def ledger_check(db: Database, tenant: str, source: str, kinds: list[str]) -> tuple[bool, dict[str, Any]]:
    """The `ledger_matches_target` check of a phase's `kinds`: (passed, metadata). Passes when each
    kind's created ledger entries equal its product rows and none is missing, shared by two source
    rows, matched to a missing row, or written to a table the check does not know."""
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
    """The `no_duplicate_claims` check of a phase's `kinds`: (passed, metadata). Passes when no source
    row was claimed twice, every product row has its ledger entry, and no source id was written twice."""
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
        return True, {**not_planned_entries(spec.kinds, run),
                      "note": MetadataValue.text(f"{', '.join(spec.kinds)} not in this run's plan")}
    r = rollups.rollup(db, run.id)
    c = r.phase_completeness(phase)
    md: dict[str, Any] = {"engine_run_id": MetadataValue.int(run.id)}
    if c is None:
        md["note"] = MetadataValue.text(f"phase {spec.index + 1} of {run.name} has not closed yet")
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
ALL_ROWS_LANDED = "all_rows_landed"


def landed_check(db: Database, tenant: str, kinds: list[str], catchup: bool = False) -> tuple[bool, dict[str, Any]]:
    """The `all_rows_landed` check of a phase's `kinds`: (passed, metadata). Every row accounted for:
    fails (severity WARN) when the tenant has skipped or failed rows of those kinds now
    (`ledger_reads.bad_row_counts`, the rows `migrate rows` lists), so a phase that closed with bad
    rows is a success with a warning in the Checks tab, not plain green (the asset's partition list
    stays green: Dagster colours it by materialisation only, docs/dagster.md).
    A row a walk left to the catch-up's walk (`waiting`) is accounted for at a data phase's close -
    the catch-up settles it - and is shown, not failed. The catch-up phase's own check (`catchup`)
    is where that promise is kept: it fails while any row of the tenant, of any kind, still waits."""
    bad = bad_row_counts(db, tenant, None if catchup else kinds)
    if catchup:  # its own kind has no rows; what it answers for is the rows left waiting for it
        bad = {k: v for k, v in bad.items() if v["waiting"]}
    skipped = sum(v["skipped"] for v in bad.values())
    failed = sum(v["failed"] for v in bad.values())
    waiting = sum(v["waiting"] for v in bad.values())
    md: dict[str, Any] = ({"waiting": MetadataValue.int(waiting)} if catchup else
                          {"skipped": MetadataValue.int(skipped), "failed": MetadataValue.int(failed),
                           "waiting": MetadataValue.int(waiting)})
    for kind, v in sorted(bad.items()):
        for name in (("waiting",) if catchup else ("skipped", "failed", "waiting")):
            md[f"{kind}/{name}"] = MetadataValue.int(v[name])
    if catchup:
        passed = not waiting
        if waiting:
            md["waiting_note"] = MetadataValue.text(
                f"{waiting} row(s) still wait for the catch-up's walk after it ran: `migrate rows {tenant} --action "
                f"waiting` lists them; `migrate run --tenant {tenant}` settles them")
    else:
        passed = not skipped and not failed
        if waiting:
            md["waiting_note"] = MetadataValue.text(
                f"{waiting} row(s) wait for the catch-up's walk: accounted for, not failed - the catch-up settles "
                "them, and its all_rows_landed check fails if any still waits")
    if bad:
        md["where"] = MetadataValue.md("\n".join(f"- `migrate rows {tenant} --kind {k}`" for k in sorted(bad))
                                       + "\n- the phase's materialization: grouped reasons")
    return passed, md


LANDED_AT_PHASE = ("Every row of the phase's kinds accounted for: fails (WARN) when the tenant has skipped or failed "
                   "rows of them, as `migrate rows` lists them. A row waiting for the catch-up's walk (its parent "
                   "not known yet) is accounted for and shown as `waiting`: the catch-up settles it, and the "
                   "catch-up's own all_rows_landed check fails if any row still waits. On a phase the tenant's "
                   "latest run does not plan, `run_kinds` says first that none of its kinds was in the run.")
LANDED_AT_CATCHUP = ("Nothing still waits: fails (WARN) when any row of the tenant, of any kind, still waits for the "
                     "catch-up's walk after it ran (the phases' all_rows_landed checks counted those rows as "
                     "settled by it), as `migrate rows TENANT --action waiting` lists them.")


def is_catchup(spec: PhaseSpec) -> bool:
    """Whether `spec` is its provider's catch-up phase (its one kind is the provider's `catchup_kind`)."""
    try:
        return spec.kinds == (catchup_kind(provider_for(spec.source)),)
    except Exception:  # noqa: BLE001 - a provider that does not load has no catch-up to tell
        return False


def ledger_check_specs(spec: PhaseSpec) -> list[AssetCheckSpec]:
    """The phase's ledger checks, each its own AssetCheckSpec on the phase's tenant partitions
    (the UI lists, selects and shows them one by one). They are evaluated by the phase asset's own op
    right after it materialises (phases._phase_asset; one step per phase, not two), and on
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
            AssetCheckSpec(ALL_ROWS_LANDED, asset=spec.key, partitions_def=tenants,
                           description=(LANDED_AT_CATCHUP if is_catchup(spec) else LANDED_AT_PHASE)),
            AssetCheckSpec(KINDS_ADD_UP, asset=spec.key, partitions_def=tenants,
                           description="Rows seen = rows accounted for = ledger claims, and = the source's own count "
                                       "where it gives one (the engine's completeness check at phase close)."),
        ]


def evaluate_ledger_checks(db: Database, tenant: str, spec: PhaseSpec, selected: set[str]) -> list[AssetCheckResult]:
    """The selected ones of the phase's ledger checks (names: LEDGER_MATCHES_TARGET,
    NO_DUPLICATE_CLAIMS, KINDS_ADD_UP, ALL_ROWS_LANDED), all read from one snapshot (`snapshot`): the engine may be
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
        if ALL_ROWS_LANDED in selected:
            passed, md = landed_check(snap, tenant, kinds, catchup=is_catchup(spec))
            out = out_of_plan(snap, tenant, spec)
            if out:  # its counts are what earlier runs left: say first that this run took none of its kinds
                md = {**out, "counts_of": MetadataValue.text(
                    "the tenant's rows of these kinds that earlier runs left skipped, failed or waiting; this "
                    "run migrated none of them"), **md}
            results.append(AssetCheckResult(asset_key=spec.key, check_name=ALL_ROWS_LANDED, passed=passed,
                                            metadata=md, severity=AssetCheckSeverity.WARN,
                                            description=out["run_kinds"].value if out else None))
    return results


def out_of_plan(db: Database, tenant: str, spec: PhaseSpec) -> dict[str, Any]:
    """`not_planned_entries` (run_kinds, phase_status) when the tenant's latest run of the phase's
    source plans none of its kinds, else {} (no run yet, or the phase is in its plan)."""
    try:
        run = runs.latest_run(db, tenant, spec.source)
    except RunNotFound:
        return {}
    return not_planned_entries(spec.kinds, run) if spec.run_phase(run) is None else {}


LEDGER_CHECKS = frozenset({LEDGER_MATCHES_TARGET, NO_DUPLICATE_CLAIMS, KINDS_ADD_UP, ALL_ROWS_LANDED})


def settle_planned_checks(context: Any, db: Database, source: str) -> int:
    """Evaluate now the ledger checks this Dagster run planned on its tenant partition and has not
    evaluated yet (of every phase), each logged as an AssetCheckEvaluation of the partition's latest
    materialisation, and a planned `matches_source` whose step will be skipped as not run here
    (`proof_not_run`); the number logged. Never raises: the step's own end matters more.

    For a step that ends without materialising its phase: a launch refused because the tenant's
    latest run succeeded (Dagster then skips every later step), a phase out of the run's plan with
    no planned phase after it. Dagster 1.13 resolves a check its run planned and never evaluated as
    SKIPPED (EXECUTION_FAILED in a FAILURE run; `AssetCheckExecutionRecord.resolve_status`,
    `asset_check_state._process_run_statuses`), and the Checks tab lists a partitioned check as
    Skipped when any tenant's latest execution is skipped, whatever the others' (ui-core
    asset-checks/util.tsx `getAggregateCheckIconType`), while "Latest execution" is the newest
    record of any tenant: one refused relaunch listed every check Skipped beside a Passed. A phase
    never materialised for the tenant is left Skipped: a 0 = 0 pass on a phase never migrated
    would mislead more (see `require_run`)."""
    try:
        tenant = context.partition_key
        records = context.instance.get_records_for_run(context.run_id, of_type={
            DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED, DagsterEventType.ASSET_CHECK_EVALUATION}).records
        planned: set[AssetCheckKey] = set()
        for r in records:
            event = r.event_log_entry.dagster_event
            data = event.event_specific_data
            key = data.asset_check_key
            if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
                planned.discard(key)
            elif key.name in LEDGER_CHECKS or key.name == MATCHES_SOURCE:
                planned.add(key)
        logged = 0
        for spec in phase_specs(source):
            names = {k.name for k in planned if k.asset_key == spec.key}
            latest = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=spec.key, asset_partitions=[tenant]), limit=1).records if names else []
            if not latest:
                continue
            target = AssetCheckEvaluationTargetMaterializationData(
                storage_id=latest[0].storage_id, run_id=latest[0].run_id, timestamp=latest[0].timestamp)
            # its step runs after a phase this run materialised (and says it did not prove it); after
            # one it did not, Dagster skips that step: said here instead, not left Skipped
            not_run = [not_run_here(context.instance, AssetCheckKey(spec.key, MATCHES_SOURCE), tenant, context.run_id)
                       ] if MATCHES_SOURCE in names and latest[0].run_id != context.run_id else []
            for result in [*evaluate_ledger_checks(db, tenant, spec, names), *not_run]:
                context.log_event(AssetCheckEvaluation(
                    asset_key=spec.key, check_name=result.check_name, passed=result.passed, partition=tenant,
                    metadata={**result.metadata, "evaluated_by": MetadataValue.text(
                        f"Dagster run {context.run_id[:8]}, which did not materialise the phase: the tenant's "
                        f"rows as they are, checked against its materialisation by run {latest[0].run_id[:8]}")},
                    severity=result.severity, description=result.description, target_materialization_data=target))
                logged += 1
        return logged
    except Exception:  # noqa: BLE001 - the checks stay as Dagster resolves them
        context.log.exception("could not evaluate the run's planned ledger checks")
        return 0


def source_check(db: Database, provider: Any, tenant: str, spec: PhaseSpec, settings: Any = None) -> tuple[bool, dict[str, Any]]:
    """`engine_core.verify` for the phase's kinds: (passed, metadata: per kind the source, ledger
    and product counts and each difference's count, the differences' ids (capped) in markdown, the
    requests and tokens spent)."""
    try:
        left = left_out_kinds(db, provider, tenant)
        if spec.kinds and all(k in left for k in spec.kinds):  # kinds no run of the tenant took (opt-in or not chosen): nothing to prove
            return True, {"note": MetadataValue.text(f"{', '.join(spec.kinds)}: {left[spec.kinds[0]]}"),
                          "requests": MetadataValue.int(0), "tokens": MetadataValue.int(0)}
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
    """Fail the step in one line when its run has no tenant partition, or one that is no valid tenant
    name (`check_tenant`: the UI's "Add a partition" accepts names the CLI refuses, and a tenant the
    CLI cannot name could never be synced), before anything is written: every phase asset and check
    is per tenant, and Dagster's checks tab launches "Execute" with none (without this, the step
    fails with DagsterInvariantViolationError's "Cannot access partition_key for a non-partitioned run").
    The invalid partition is deleted as it is refused: kept, it shows every phase and check failed.
    The refusal ends the run CANCELED, not FAILURE: Dagster 1.13 counts every partition a FAILURE run
    planned and did not materialise as failed (`partition_status_cache`), so one refused name turned
    the partition of every phase asset red; a CANCELED run's planned partitions stay as they were."""
    if not context.has_partition_key:
        raise Failure(description="no tenant partition: the phase assets and their checks are per tenant - launch "
                                  "this with a tenant partition (the asset's Materialize, or the launchpad's "
                                  "partition), or `migrate verify TENANT`", allow_retries=False)
    try:
        check_tenant(context.partition_key, "the tenant partition")
        return
    except ConfigError as e:
        refused = str(e)
    said = "nothing was written"
    try:  # a partition no run can use: left there, every phase and check of the asset shows it failed
        context.instance.delete_dynamic_partition(tenants.name, context.partition_key)
        said += " and the partition is removed"
    except Exception:  # noqa: BLE001 - the refusal stands either way; the partition can be deleted in the UI
        pass
    # a CANCELING run whose step fails ends CANCELED; tagged as the step's own cancel, so the
    # `migrate` process's watcher does not take it for a terminate (`cancel.cancel_this_run`)
    cancel_this_run(context, f"{refused}; {said} - add the tenant under a valid name")


def require_run(db: Database, tenant: str, spec: PhaseSpec) -> None:
    """Fail the step in one line when the tenant has no run of the phase's source: its ledger checks,
    evaluated on their own, would compare an empty ledger with empty tables and pass 0 = 0 on a phase
    that was never migrated. Called only where the checks run without the phase
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
    selection as None) or its asset selection
    is given and empty with no check selection (a job of checks).

    "Materialize all" on the asset graph (and a backfill) puts every check of the selected assets in
    the run, `matches_source` included; a launch of `__ASSET_JOB` with no selection runs every asset
    and check. The proof spends source tokens, so those runs skip it (a plain
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

        # A subsettable multi-asset check: a run of the check alone proves the phase; a run that
        # materialises assets records that it did not (`proof_not_run`: no request, no token).
        @multi_asset_check(
            name=f"{spec.key.to_python_identifier()}_{MATCHES_SOURCE}",
            specs=[AssetCheckSpec(MATCHES_SOURCE, asset=spec.key, blocking=False, partitions_def=tenants,
                                  description=(f"The source's ids of {', '.join(spec.kinds)} (cheapest listing) = "
                                               "the ledger = the product's rows: names every missing, extra, "
                                               "duplicated and stale row, and the requests and tokens it spent. "
                                               "Spends source tokens, so it runs only when asked for on its own "
                                               "(the verify_tenant job on a tenant partition, or `migrate verify "
                                               "TENANT`): a run from the asset graph's Materialize records it not "
                                               "passed (WARN) with `not_run` saying so and `latest_proof` the "
                                               "tenant's latest real proof; the tenant and sync jobs leave it out."))],
            can_subset=True,
        )
        def matches_source(context: AssetCheckExecutionContext, database: MigrationDatabase, source: SourceResource,
                           lane: LaneSettings):
            require_tenant(context)
            if not proof_requested(context.run, key):  # an asset-graph launch put it in: say so, not Skipped
                context.log.info(f"{MATCHES_SOURCE} of {spec.key.to_user_string()} not run: it spends source tokens "
                                 f"and runs only on its own - {how_to_prove(context.partition_key)}")
                yield not_run_here(context.instance, key, context.partition_key, context.run.run_id)
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
