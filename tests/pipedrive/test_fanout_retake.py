"""A fan-out row read before its parent was written is read again by the catch-up: a participant
whose person changed at the source after the run started (the persons walk leaves the person to the
catch-up, so the participants phase finds it not written and skips the participant) ends written
once the catch-up has written the person - one participants read per deal listing such rows - and
`verify` does not pass a tenant holding a skipped row whose parents are all written now
(`retake.py`, `verify`'s `takeable`)."""
from __future__ import annotations

from typing import Any

import pytest

from engine_core.providers.pipedrive import catchup
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from tests.pipedrive.support import FAST, failed_tasks, ledger, live_op, migrate, sandbox, start, sync
from engine_core import runs
from engine_core.providers.registry import for_run
from engine_core.worker import drain_threads

TENANT = "acme"


def _person_changed_after_start(db, sb) -> tuple[Any, str, set[str], dict[str, set[str]]]:
    """Start a run with participants, then update at the source a person some participants name
    (before any walk: the persons walk, bounded by the run's snapshot, leaves it to the catch-up).
    Returns the run, the person, its participants' ids and {deal: participant ids} of them."""
    truth = sb.truth("participants")["participants"]
    named: dict[str, dict[str, set[str]]] = {}
    for deal, rows in truth.items():
        for p in rows:
            named.setdefault(str(p["person_id"]), {}).setdefault(str(deal), set()).add(str(p["id"]))
    run = start(db, sb, TENANT, kinds=["+participants"])
    for _ in range(40):
        change = live_op(sb, "update")
        if change["kind"] == "persons" and str(change["id"]) in named:
            person = str(change["id"])
            by_deal = named[person]
            return run, person, {sid for ids in by_deal.values() for sid in ids}, by_deal
    pytest.fail("no participant's person was updated in 40 live updates")


def _drain(db, run_id: int) -> Any:
    drain_threads(db, run_id, width=4, settings=FAST, providers=for_run)
    return runs.get_run(db, run_id)


def test_a_participant_read_before_its_person_is_written_ends_written(db) -> None:
    with sandbox() as sb:
        run, person, participants, by_deal = _person_changed_after_start(db, sb)
        done = _drain(db, run.id)
        assert done.status == "succeeded", failed_tasks(db, run.id)
        persons = ledger(db, TENANT, "persons")
        assert persons[person]["action"] == "created"
        got = ledger(db, TENANT, "participants")
        assert {sid: got[sid]["action"] for sid in participants} == {sid: "created" for sid in participants}, \
            {sid: got[sid]["reason"] for sid in participants}
        # frugal: one participants read per deal listing such rows, in tasks of the catch-up's persons
        retaken = db.sql("SELECT cursor FROM migration_tasks WHERE migration_id = %(r)s AND cursor_key LIKE"
                         " 'participants:retake-%%'", {"r": run.id})
        records = [d for t in retaken for d in t["cursor"]["records"]]
        assert sorted(records) == sorted(int(d) for d in by_deal), retaken
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["participants", "persons"])
    assert proof.passed, proof.lines()


def test_verify_fails_on_a_skipped_row_whose_parent_is_written_now_and_a_sync_takes_it(db, monkeypatch) -> None:
    # the catch-up's retake off: the run leaves the participants skipped though their person is written
    monkeypatch.setattr(catchup, "read_again", lambda ctx, lk: [])
    with sandbox() as sb:
        run, person, participants, _ = _person_changed_after_start(db, sb)
        assert _drain(db, run.id).status == "succeeded", failed_tasks(db, run.id)
        got = ledger(db, TENANT, "participants")
        assert {got[sid]["action"] for sid in participants} == {"skipped"}
        assert all(f"person {person}" in got[sid]["reason"] for sid in participants)
        provider = PipedriveProvider(base_url=sb.base_url)
        proof = verify(db, provider, TENANT, FAST, kinds=["participants"])
        assert not proof.passed
        (kind,) = proof.kinds
        assert kind.takeable == sorted(participants, key=lambda s: (len(s), s)), proof.lines()
        said = [line for line in proof.lines() if line.startswith("  takeable")]
        assert len(said) == 1 and f"`migrate sync {TENANT}` takes them" in said[0], proof.lines()
        monkeypatch.undo()
        sync(db, sb, TENANT)
        got = ledger(db, TENANT, "participants")
        assert {got[sid]["action"] for sid in participants} == {"created"}
        again = verify(db, provider, TENANT, FAST, kinds=["participants"])
    assert again.passed, again.lines()
