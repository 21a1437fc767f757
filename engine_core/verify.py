"""A proof from the source: the source's ids per kind against the ledger and the product.

`verify(db, provider, tenant_id, settings, kinds=None)` lists every id the source has now, per
kind, by the provider's cheapest listing (`Provider.source_ids`, with the row's version where the
listing carries one), reads the tenant's ledger (`migration_records`) and the product's rows
(`crm.*`: the tables the ledger's `record_type` names), and names every difference:

* **missing**: at the source, but no live product row for it (none written, its product row gone,
  or marked `deleted_at_source` although the source lists it again). A source row the ledger
  accounts for as skipped or failed - with its reason, `migrate explain` tells it - is counted as
  `unwritten`, not missing: the ledger says why it is not there. So is a row listed without a
  readable id (none, or `"abc"`), kept as failed beside the ledger (`migration_unreadable`): the
  listing serves each under the key its run kept it by (`rows.unreadable_key`), so every such row
  counts once and is matched to its own record. The children of a record served without a
  readable id cannot be listed (they are asked by its id: Pipedrive's mail of a deal): the listing
  serves each such record once under the key its run kept them by (one record kept apart as failed,
  "deal sha256:..."), so they count as the run counts them - one row of the source's figure, said
  among the rows without a readable id, whose kept reason (`migrate rows`) names how many children
  the source reports. A placeholder
  waiting for the catch-up's walk (a run stopped before it) is among them and said apart (`waiting`).
* **extra**: live in the ledger or the product (not marked `deleted_at_source`) but gone at the
  source: a delete or a merge the product has not caught up with.
* **duplicated**: more than one product row for one source row (rows carrying `source_id`).
* **stale**: the ledger's `source_version` differs from the version the source lists now (a
  change not synced; `ledger.same_version`: one instant in the v1 and v2 time formats is one version). Ledger rows without a version (written before versions were kept) are
  counted as `unversioned` and not compared.
* **takeable**: skipped, listed by the source, and every parent it was skipped for is written now
  (`ledger_reads.takeable`: the parents the placeholder kept, migration 0019): not a settled skip
  but a row read before its parent was written, which the engine can still take - a sync does
  (the catch-up reads such rows again, `retake`). Counted among `unwritten` too.
* **owed**: written with a link still owed to a kind some run of the tenant has taken since (the
  run that took it did not finish, so it did not fill the link: `owed_links`).
* **owed to a kind left out** (not a difference, said with the kind and the run that fills it):
  written with a link left empty because no run of the tenant took the parent's kind (a contact's
  owner when users were left out); a run of that kind fills it (`owed_links`).
* **unreachable** (not a difference): an item whose sub-resource the source refuses to this token
  while the token reads the account (Pipedrive: a deal whose mail listing answers 403) - its
  children cannot be listed, so they are neither missing nor, when the product holds some from
  an earlier run, extra; named with the reason (the run told the same beside the ledger).
* **kept** (not a difference): a row the product already had (the ledger's action `matched`: an
  existing contact or company) whose source version is newer than the one matched. The product's
  own row is not overwritten unless a run or sync has the option `overwrite_matched` (the ledger
  then takes the new version), so this is the user's choice, named with what to do about it, and
  it does not fail the proof.

The **ledger** figure of a kind is every live entry the ledger holds for it: the claims (created
or matched, not marked deleted: `imported`) and the placeholders held with a reason (skipped,
failed, waiting; the rows `migrate rows` lists), so that it agrees with the verdict's "every source
row is accounted for"; a kind's line names its parts.

Kinds fold into ledger identities (`deals_archived` into `deals`, `leads_archived` into `leads`:
one identity per source record, whichever list serves it). A kind the provider cannot list
(`NotImplementedError`: Pipedrive's field definitions, refreshed by every run) is reported as not
checked, with the provider's reason, and does not decide the verdict; a result with no kind checked
does not pass. The provider's catch-up kind (`catchup_kind`) is no data kind and is not listed.

Cost: every request the listings make and its tokens (the endpoint's `x-token-cost`) are counted
by the provider into `options["cost"]`; the result carries them beside the differences, with the
wall time. Read-only: nothing is written to the ledger, the product or the source.

Verify a quiet tenant (no run or sync writing): a row written between the listing and the ledger
read shows as a difference that the next verify no longer finds.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from engine_core import definitions, runs, runs_reads
from engine_core.config import Settings
from engine_core.db import Database
from engine_core.errors import ConfigError, NothingMigrated
from engine_core.ledger import newer, same_version
from engine_core.ledger_reads import owed_of_kind, takeable, tenant_entries, tenant_unreadable, waiting_counts
from engine_core.models import LIVE, Run
from engine_core.rows import WAITS_FOR_WALK
from engine_core.source import Provider, catchup_kind, identity_of, opt_in_kinds, source_ids
from engine_core.verify_result import DIFFERENCES, KindResult, VerifyResult  # noqa: F401 - the result types, as this module always offered them

CREDENTIALS_TIMEOUT_SECONDS = 5.0  # the launch's token check's timeout (`launch.checks.CONNECT_TIMEOUT_SECONDS`)
# Why a kind the provider has no id listing for is not compared, in a user's words (the provider's
# own note, "no id listing for 'fields'", said what is missing, not why that is no gap in the proof)
NOT_LISTED_WHY: dict[str, str] = {
    definitions.KIND: ("field definitions are not compared id by id: every run and sync reads the source's whole "
                       "field lists again, updates the stored ones and marks those no longer listed deleted at the "
                       "source"),
}
WRITTEN = ("created", "matched")
PLACEHOLDERS = ("skipped", "failed")
# The product table of a ledger kind when the ledger has no claim naming it yet (the crm writers'
# record types); a table named by the ledger's `record_type` is always read too.
DEFAULT_TABLES: dict[str, str] = {
    "users": "crm.users", "pipelines": "crm.pipelines", "stages": "crm.stages",
    "organizations": "crm.companies", "companies": "crm.companies",
    "persons": "crm.contacts", "contacts": "crm.contacts", "deals": "crm.deals", "leads": "crm.leads",
    "activities": "crm.activities", "notes": "crm.notes", "emails": "crm.emails",
    "participants": "crm.deal_participants", "followers": "crm.followers", "deal_history": "crm.deal_history",
    # the further families (file contents are claimed on their file's metadata row)
    "products": "crm.products", "deal_products": "crm.deal_products", "files": "crm.files", "file_contents": "crm.files",
}
# A ledger kind whose product rows are live only in a state of their own: a file's content is in
# the product when its metadata row says it is stored (the row itself is the `files` kind's).
LIVE_WHEN: dict[str, sql.Composable] = {"file_contents": sql.SQL("x.content_status = 'stored'")}
# A ledger kind whose rows without a readable id are kept under another kind's: a file listed
# without one fails as a `files` row, and its content, with no id to download it by, is never asked.
UNREADABLE_UNDER: dict[str, tuple[str, ...]] = {"file_contents": ("files",)}


def ledger_kind_of(provider: Provider) -> Callable[[str], str]:
    """The provider's kind -> ledger kind fold (one identity per source record)."""
    fold = getattr(provider, "ledger_kind", None)
    if callable(fold):
        return fold
    return lambda kind: kind


def listing_kinds(provider: Provider, kinds: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Ledger kind -> the plan kinds to list for it, in plan order. `kinds` may name plan kinds or
    ledger kinds (`deals` brings `deals_archived` with it); ConfigError names an unknown one."""
    fold = ledger_kind_of(provider)
    skip = catchup_kind(provider)  # the catch-up phase is no data kind of its own
    plan = [k for group in provider.phases() for k in group if k != skip]
    wanted = None if kinds is None else [k.strip() for k in kinds if k and k.strip()]
    if wanted is not None:
        known = set(plan) | {fold(k) for k in plan}
        unknown = [k for k in wanted if k not in known]
        if unknown:
            raise ConfigError(f"kinds: {', '.join(unknown)} not in the {provider.source} plan; known: {', '.join(plan)}")
    targets = None if wanted is None else {fold(k) for k in wanted}
    out: dict[str, list[str]] = {}
    for k in plan:
        lk = fold(k)
        if targets is None or lk in targets:
            out.setdefault(lk, []).append(k)
    return out


def _norm(source_id: object) -> str:
    return str(source_id).strip().lower()


@dataclass(frozen=True)
class VerifyStep:
    """Where a verify is, for a progress display: the ledger `kind` being read (its `index`, from
    1, of `total` kinds to read), the ids its listing gave so far (`listed`), the requests the
    verify made so far, and `done` once the kind's listing is complete (it is compared next)."""

    kind: str
    index: int
    total: int
    listed: int
    requests: int
    done: bool = False


VerifyProgress = Callable[[VerifyStep], None]
STEP_EVERY_IDS = 100  # a kind's listing reports progress every this many ids (a page is 100-500)


def list_source(provider: Provider, kind: str, settings: Settings, options: dict[str, Any],
                listed: Callable[[int], None] | None = None) -> dict[str, str | None]:
    """Every id the source lists now for one provider kind -> its version (None when the listing
    has none); `listed(n)` is told every STEP_EVERY_IDS ids. NotImplementedError when the provider
    cannot list that kind."""
    out: dict[str, str | None] = {}
    for sid, version in source_ids(provider, settings, kind, options):
        out[_norm(sid)] = None if version is None else str(version)
        if listed is not None and len(out) % STEP_EVERY_IDS == 0:
            listed(len(out))
    return out


def _regclass(db: Database, name: str) -> str | None:
    row = db.sql("SELECT to_regclass(%(t)s)::text AS reg", {"t": name})
    return row[0]["reg"] if row and row[0]["reg"] else None


def _columns(db: Database, table: str) -> set[str]:
    schema, _, name = table.rpartition(".")
    rows = db.sql("SELECT column_name FROM information_schema.columns WHERE table_schema = %(s)s AND table_name = %(n)s",
                  {"s": schema or "public", "n": name})
    return {r["column_name"] for r in rows}


def _ledger(db: Database, tenant_id: str, source: str, kind: str) -> dict[str, dict[str, Any]]:
    """source id -> {action, record_type, record_id, version, deleted}: the tenant's ledger for a kind,
    placeholders included. The version and the deleted mark are what `ledger_reads.ledger_index` reads
    (migration 0010); the action and the record say whether and where the product holds the row."""
    rows = tenant_entries(db, tenant_id, source, kind)
    entries = {_norm(r["source_id"]): dict(r) for r in rows}
    # rows served without a readable id (none, or "abc"): failed, kept beside the ledger each under
    # its raw key (migration 0013), the key the listing serves it under: unwritten with its reason,
    # not missing (the run accounted for it), one by one
    unreadable = [r for k in (kind, *UNREADABLE_UNDER.get(kind, ())) for r in tenant_unreadable(db, tenant_id, source, k)]
    for r in unreadable:
        entries.setdefault(_norm(r["source_id"]), {"source_id": r["source_id"], "action": "failed", "record_type": None,
                                                   "record_id": None, "version": None, "deleted": None,
                                                   "not_an_id": True})
    return entries


def _product(db: Database, tenant_id: str, source: str, tables: Iterable[str],
             record_ids: dict[str, set[int]], when: sql.Composable | None = None) -> tuple[dict[str, list[bool]], dict[str, set[int]]]:
    """Per table: the product rows carrying this source's ids (source id -> [live?] per row), and
    which of the ledger's record ids exist and are live (for matched rows, which carry no source);
    `when`: a further condition for a row to be live (`LIVE_WHEN`)."""
    by_sid: dict[str, list[bool]] = {}
    live_ids: dict[str, set[int]] = {}
    for table in tables:
        cols = _columns(db, table)
        schema, _, name = table.rpartition(".")
        ident = sql.Identifier(schema, name)
        live = sql.SQL("x.deleted_at_source IS NULL") if "deleted_at_source" in cols else sql.SQL("true")
        if when is not None:
            live = sql.SQL("({} AND {})").format(live, when)
        with db.connection() as c:
            if {"source", "source_id", "tenant_id"} <= cols:
                q = sql.SQL("SELECT x.source_id, {live} AS live FROM {t} x"
                            " WHERE x.tenant_id = %(t)s AND x.source = %(s)s AND x.source_id IS NOT NULL"
                            ).format(live=live, t=ident)
                for r in c.sql(q, {"t": tenant_id, "s": source}):
                    by_sid.setdefault(_norm(r["source_id"]), []).append(bool(r["live"]))
            ids = sorted(record_ids.get(table, ()))
            if ids:
                q = sql.SQL("SELECT x.id FROM {t} x WHERE x.id = ANY(%(ids)s) AND {live}").format(t=ident, live=live)
                live_ids[table] = {int(r["id"]) for r in c.sql(q, {"ids": ids})}
    return by_sid, live_ids


def compare(kind: str, listed_as: Iterable[str], at_source: dict[str, str | None], ledger: dict[str, dict[str, Any]],
            product_rows: dict[str, list[bool]], live_records: dict[str, set[int]],
            unreachable: dict[str, tuple[str, list[str]]] | None = None) -> KindResult:
    """The differences of one ledger kind, from what the source lists, the ledger and the product
    rows (pure: the rules of the module docstring). `unreachable`: items whose children the source
    refused to list -> (reason, the children's source ids the product holds)."""
    result = KindResult(kind, tuple(listed_as), source=len(at_source))
    result.unreachable = {item: reason for item, (reason, _) in (unreachable or {}).items()}
    beyond_reach = {_norm(sid) for _, held in (unreachable or {}).values() for sid in held}

    def live_in_product(sid: str) -> bool:
        if any(product_rows.get(sid, ())):
            return True
        entry = ledger.get(sid)
        return (entry is not None and entry["action"] in WRITTEN and entry["record_id"] is not None
                and int(entry["record_id"]) in live_records.get(entry["record_type"] or "", ()))

    for sid, entry in ledger.items():
        if entry["action"] in WRITTEN:
            if entry["deleted"] is not None:
                result.deleted_marked += 1
            else:
                result.imported += 1
            if entry["version"] is None:
                result.unversioned += 1
        elif entry["action"] in PLACEHOLDERS:
            # held with a reason, as `migrate rows` lists it: part of what the ledger accounts for
            result.ledger += 1
            if sid not in at_source:
                result.unlisted_placeholders += 1
    result.ledger += result.imported
    live = {sid for sid in set(product_rows) | set(ledger) if live_in_product(sid)}
    result.product = len(live)
    for sid, version in at_source.items():
        entry = ledger.get(sid)
        if sid not in live:
            if entry is not None and entry["action"] in PLACEHOLDERS:
                result.unwritten += 1
                result.unwritten_ids.append(sid)
                if entry["action"] == "failed":
                    result.failed += 1
                elif WAITS_FOR_WALK in (entry.get("reason") or ""):
                    result.waiting += 1
                else:
                    result.skipped += 1
                if entry.get("not_an_id"):
                    result.not_ids.append(sid)
            else:
                result.missing.append(sid)
            continue
        if entry is not None and entry["action"] in WRITTEN and entry["version"] is not None and version is not None \
                and not same_version(entry["version"], version):
            if entry["action"] == "matched" and newer(version, entry["version"]):
                result.kept.append(sid)  # the product's own row, kept by choice (module docstring)
            else:
                result.stale.append(sid)
    for sid in set(ledger) | set(product_rows):
        if sid in at_source or sid in beyond_reach:
            continue
        entry = ledger.get(sid)
        claimed_live = entry is not None and entry["action"] in WRITTEN and entry["deleted"] is None
        if claimed_live or sid in live:
            result.extra.append(sid)
    result.duplicated = [sid for sid, rows in product_rows.items() if len(rows) > 1]
    for d in (*DIFFERENCES, "unwritten_ids", "kept", "not_ids"):
        getattr(result, d).sort(key=lambda s: (len(s), s))
    return result


def unfinished_run_line(db: Database, run: Run) -> str | None:
    """Why a proof of the tenant finds rows missing that are no fault: its latest `run` did not
    finish. One line naming the run, how many rows wait for its catch-up (`waiting_counts`: rows
    left to the catch-up's walk) and what resumes it, e.g. "run #7 stopped before it finished (332
    rows wait for its catch-up); `migrate run --tenant acme` resumes it"; None for a run that
    succeeded or a dry run (it writes nothing)."""
    if run.status == "succeeded" or run.dry_run:
        return None
    n = sum(waiting_counts(db, run.id).values())
    wait = f" ({n} row{'' if n == 1 else 's'} wait{'s' if n == 1 else ''} for its catch-up)" if n else ""
    if run.status in LIVE:
        return f"run #{run.id} is still {run.status}, not finished{wait}; `migrate status {run.tenant_id}` follows it"
    return (f"run #{run.id} {run.status} before it finished{wait}; "
            f"`migrate run --tenant {run.tenant_id}` resumes it")


def left_out_kinds(db: Database, provider: Provider, tenant_id: str) -> dict[str, str]:
    """The provider's kinds no run of the tenant took (dry runs aside; `runs_reads.kinds_taken`),
    catch-up kind aside, each with the note verify shows for it: "left out (opt-in)" for a kind a
    run takes only when asked (`source.opt_in_kinds`), "left out (not chosen)" for one the runs
    named other kinds than. Such a kind is left out, not missing: the proof lists nothing for it
    and it does not decide the verdict. A kind some run took, even one that did not finish, is
    proven (what it lacks is missing)."""
    taken = runs_reads.kinds_taken(db, tenant_id, provider.source)
    optional = opt_in_kinds(provider)
    ck = catchup_kind(provider)
    out: dict[str, str] = {}
    for group in provider.phases():
        for k in group:
            if k == ck or k in taken:
                continue
            why = "opt-in" if k in optional else "not chosen"
            out[k] = (f"left out ({why}): no run of the tenant took it; "
                      f"`migrate run --tenant {tenant_id} --kinds {k}` migrates it")
    return out


def verify(db: Database, provider: Provider, tenant_id: str, settings: Settings | None = None,
           kinds: Iterable[str] | None = None, progress: VerifyProgress | None = None) -> VerifyResult:
    """Prove the tenant's ledger and product rows against what the source lists now.

    `kinds`: plan or ledger kinds to prove (default: every kind of the provider's plan). Returns a
    VerifyResult (per ledger kind: counts and the ids of every difference; requests, tokens and
    seconds spent). Raises RunNotFound (one line, names the tenant) when no run of this source ever
    ran for the tenant, NothingMigrated when its only runs are dry runs (before any request), TenantSourceMismatch when the provider reaches another source than the
    tenant's data came from (`runs.check_tenant_identity`), ConfigError for an unknown kind or, when the
    source cannot say whose data it serves, a credential its `check_credentials` refuses (one line naming
    the variable, as the launch says it); the source's own errors (auth, rate limit
    after the client's retries) propagate. Holds no database connection while it lists. `progress`
    is told each kind's start, its listing's ids as they come, and its end (`VerifyStep`): under
    latency a listing of every record takes minutes."""
    settings = settings or Settings.from_env()
    latest = runs.latest_run(db, tenant_id, provider.source)  # an unknown tenant is one line, before any request
    if latest.dry_run and not runs_reads.kinds_taken(db, tenant_id, provider.source):
        # every kind would read "left out" and the empty proof would pass: nothing was written to prove
        raise NothingMigrated(f"tenant {tenant_id!r} has only a dry run (run #{latest.id}): nothing was migrated, "
                              f"so there is nothing to verify; `migrate run --tenant {tenant_id}` migrates it")
    started = time.monotonic()
    cost = {"requests": 0, "tokens": 0}
    # another company's settings: refused before its listings spend that account's tokens
    check = getattr(provider, "check_credentials", None)
    identity = identity_of(provider, cost, warn=not callable(check), db=db)
    if identity is None and callable(check):
        # unanswered (a refused token, a server that is no such API): the launch's own check names
        # the variable to fix in the words `migrate run` and `migrate plan` use, before any listing
        check(CREDENTIALS_TIMEOUT_SECONDS)
    runs.check_tenant_identity(db, tenant_id, provider.source, identity)
    unreachable: dict[str, tuple[str, list[str]]] = {}
    options: dict[str, Any] = {"db": db, "cost": cost, "tenant_id": tenant_id, "unreachable": unreachable}
    results: list[KindResult] = []
    left = left_out_kinds(db, provider, tenant_id)
    to_read = {lk: pk for lk, pk in listing_kinds(provider, kinds).items() if not all(k in left for k in pk)}
    for lk, plan_kinds in listing_kinds(provider, kinds).items():
        if lk not in to_read:  # no request: the tenant was never migrated with it
            results.append(KindResult(lk, tuple(plan_kinds), checked=False, note=left[plan_kinds[0]]))
            continue
        at_source: dict[str, str | None] = {}
        unreachable.clear()
        index = list(to_read).index(lk) + 1

        def step(n: int, done: bool = False, lk: str = lk, index: int = index) -> None:
            if progress is not None:
                progress(VerifyStep(lk, index, len(to_read), n, int(cost["requests"]), done))
        step(0)
        # a list no run took (archived deals not chosen): only its rows a run wrote count (moved there)
        held = _ledger(db, tenant_id, provider.source, lk) if any(k in left for k in plan_kinds) else {}
        try:
            for k in plan_kinds:
                served = list_source(provider, k, settings, options, lambda n, before=len(at_source): step(before + n))
                at_source.update((sid, v) for sid, v in served.items() if k not in left or sid in held)
            step(len(at_source), True)
        except NotImplementedError as e:
            results.append(KindResult(lk, tuple(plan_kinds), checked=False,
                                      note=NOT_LISTED_WHY.get(lk) or str(e) or f"the {provider.source} provider cannot list {lk}"))
            continue
        entries = _ledger(db, tenant_id, provider.source, lk)
        tables = {e["record_type"] for e in entries.values() if e["record_type"]}
        if lk in DEFAULT_TABLES:
            tables.add(DEFAULT_TABLES[lk])
        tables = {t for t in tables if _regclass(db, t)}
        record_ids: dict[str, set[int]] = {}
        for e in entries.values():
            if e["action"] in WRITTEN and e["record_id"] is not None and e["record_type"] in tables:
                record_ids.setdefault(e["record_type"], set()).add(int(e["record_id"]))
        product_rows, live_records = _product(db, tenant_id, provider.source, sorted(tables), record_ids, LIVE_WHEN.get(lk))
        result = compare(lk, plan_kinds, at_source, entries, product_rows, live_records, dict(unreachable))
        unwritten = set(result.unwritten_ids)
        result.takeable = sorted((sid for _, sid, _ in takeable(db, tenant_id, provider.source, [lk]) if _norm(sid) in unwritten),
                                 key=lambda s: (len(s), s))
        for r in owed_of_kind(db, tenant_id, provider.source, lk):
            if r["parent_kind"] in left:  # left out: said, not a difference
                result.owed_to.setdefault(r["parent_kind"], []).append(r["source_id"])
            else:
                result.owed.append(r["source_id"])
        result.owed = sorted(set(result.owed), key=lambda s: (len(s), s))
        result.owed_to = {p: sorted(set(ids), key=lambda s: (len(s), s)) for p, ids in result.owed_to.items()}
        results.append(result)
    return VerifyResult(tenant_id, provider.source, results, requests=int(cost["requests"]),
                        tokens=int(cost["tokens"]), seconds=time.monotonic() - started,
                        unfinished=unfinished_run_line(db, latest))
