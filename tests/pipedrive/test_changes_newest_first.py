"""A sync that lists only what changed (`detect_deletes: false`) walks the files - a list without
`updated_since` - newest first and stops at the first page that reaches a file older than the
sync's `since` (`kinds.NEWEST_FIRST`): it walked the whole list (4 calls on the small account for
one that changed nothing). Every file replaced since the run is still written at its new version.
Real sandbox (pages capped at 10 rows), real Postgres.
"""
from __future__ import annotations

from engine_core import runs
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.registry import for_run
from engine_core.worker import drain_threads
from tests.pipedrive.support import FAST, UNLIMITED, failed_tasks, live_op, migrate, sandbox


def _versions(db, tenant: str = "acme") -> dict[str, str]:
    rows = db.sql("SELECT source_id, source_version FROM migration_records WHERE tenant_id = %(t)s"
                  " AND source = 'pipedrive' AND kind = 'files'", {"t": tenant})
    return {r["source_id"]: r["source_version"] for r in rows}


def test_a_changes_only_sync_walks_the_files_newest_first_and_stops_at_the_unchanged(db) -> None:
    with sandbox(page_cap=10) as sb:
        run = migrate(db, sb, kinds=["files"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        files = len(sb.truth("files")["files"])
        assert files > 20, "the files must be several pages"
        before = _versions(db)
        replaced = {str(live_op(sb, "file_replace")["id"]) for _ in range(12)}
        asked = _changes_only_sync(db, sb, "/v1/files")
    after = _versions(db)
    assert {sid for sid in after if after[sid] != before.get(sid)} == replaced, "every file replaced, and only those"
    pages = -(-files // 10)
    assert 1 <= asked < pages, f"{asked} calls of /v1/files: the walk did not stop at the unchanged files ({pages} pages)"



def _changes_only_sync(db, sb, path: str) -> int:
    """A changes-only sync of tenant acme (`detect_deletes: false`), drained to success; the calls of
    `path` it made."""
    sb.reset_stats()
    opts = {"base_url": sb.base_url, "burst_limit": UNLIMITED, "detect_deletes": False}
    started = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), "acme", options=opts, settings=FAST)
    drain_threads(db, started.id, width=4, settings=FAST, providers=for_run)
    assert runs.get_run(db, started.id).status == "succeeded", failed_tasks(db, started.id)
    return sb.stats()["requests"].get(path, 0)


def _lead_versions(db, ids: set[str]) -> dict[str, str]:
    rows = db.sql("SELECT source_id, source_version FROM migration_records WHERE tenant_id = 'acme'"
                  " AND source = 'pipedrive' AND kind = 'leads' AND action = 'created' AND source_id = ANY(%(ids)s)",
                  {"ids": sorted(ids)})
    return {r["source_id"]: r["source_version"] for r in rows}


# The tiny account of seed 5 has 8 archived leads (of 20): in pages of two, several pages, as the walk needs.
LEAD_PAGE = 2


def test_a_changes_only_sync_walks_the_archived_leads_newest_first_and_stops_at_the_unchanged(db) -> None:
    """Archived leads take no `updated_since` either: walked newest first, the sync stops at the
    first page reaching a lead older than its `since`, and every lead archived since is written at
    its new version."""
    with sandbox(seed=5, page_cap=LEAD_PAGE) as sb:
        run = migrate(db, sb, kinds=["organizations", "persons", "leads", "leads_archived"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        listed = len(sb.truth("leads_archived")["ids"]["leads_archived"])
        assert listed > 2 * LEAD_PAGE, "the archived leads must be several pages"
        archived: set[str] = set()
        for _ in range(40):
            change = live_op(sb, "archive")
            if change.get("kind") == "leads":
                archived.add(str(change["id"]).lower())
            if len(archived) == 3:
                break
        before = _lead_versions(db, archived)
        assert archived and set(before) == archived, (archived, before)
        asked = _changes_only_sync(db, sb, "/v1/leads/archived")
    after = _lead_versions(db, archived)
    assert all(after[sid] != before[sid] for sid in archived), "every lead archived since the run is written anew"
    pages = -(-(listed + len(archived)) // LEAD_PAGE)
    assert 1 <= asked < pages, f"{asked} calls of /v1/leads/archived: the walk did not stop at the unchanged ({pages} pages)"
