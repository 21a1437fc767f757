"""Fan-out rows read before their parent was written, read again by the catch-up.

A kind read per record - a deal's participants, followers, history, product lines and mail - is
not walked by the catch-up (`kinds.Kind.catchup` None): a row of it is read once, through its
record's list, when its phase (or a recheck) reads that record. A parent the row needs and the
ledger does not hold then - a participant's person updated at the source after the run started,
so the persons walk left it to the catch-up, which wrote it seconds later - makes the row a
placeholder ("person 12 exists at the source but is not written"), and nothing lists the row
again: the catch-up re-reads a record's lists only for records it writes, and a sync's
`retake_skipped` asks by id only the kinds it walks (a fan-out row has no GET by id). Without this
the run succeeds with the row skipped though its reason no longer holds.

So when the catch-up has written a ledger kind (its `deletes` task, or a sync's `skipped` task:
every page of the kind's lists written, and the rows that answered by id), it reads again, through
their fan-out, the placeholders of the run's fan-out kinds that missed a parent of that kind and
whose every parent is written now (`ledger_reads.takeable`, from the parents the ledger keeps on
a placeholder, migration 0019): one read per record listing them - the record is the parent of a
kind the fan-out lists for (`LISTED_UNDER`: a participant's deal) - batched as the fan-out
batches (`record_lists.RECORDS_PER_TASK` records a task, `lines.IDS_PER_CALL` deals a call,
`catchup.DEALS_PER_TASK` deals a mail task). A placeholder whose parent is still not written is
not read and stays skipped with its reason. Requests only for placeholders whose parent got
written: a run whose rows all found their parents asks nothing more. A placeholder noted before
the ledger kept parents is not found (its next change, or a run of the kind, takes it).

File contents are not here: a content is skipped for what the download answered (403, 404, too
large), never for a missing parent - its discovery reads the files the product already holds.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine_core.db import Conn, Database
from engine_core.ledger_reads import takeable
from engine_core.models import Run, Successor
from engine_core.providers.pipedrive import lines, record_lists

# Fan-out kinds (read per record, not walked by the catch-up) -> the ledger kinds of the records
# whose lists serve their rows: the parent among a row's parents that names the record to read again.
LISTED_UNDER: dict[str, tuple[str, ...]] = {
    **{kind: family.of for kind, family in record_lists.FAMILIES.items()},
    lines.KIND: ("deals",),
    "emails": ("deals",),
}


def records_to_read(conn: Database | Conn, run: Run, parent_kind: str) -> dict[str, dict[str, list[int]]]:
    """The records whose fan-out lists the catch-up reads again now that ledger kind `parent_kind`
    is written: {fan-out kind: {record ledger kind: [record source ids, ascending]}}, for the run's
    fan-out kinds' placeholders that missed a `parent_kind` parent and whose every parent is written
    now (module docstring). One read of the ledger, no request."""
    kinds = [k for k in LISTED_UNDER if k in run.kinds]
    if run.dry_run or not kinds:
        return {}
    out: dict[str, dict[str, set[int]]] = {}
    for kind, _, parents in takeable(conn, run.tenant_id, run.source, kinds, missing_of=parent_kind):
        record = _record_of(parents, LISTED_UNDER[kind])
        if record is not None:
            out.setdefault(kind, {}).setdefault(record[0], set()).add(record[1])
    return {kind: {of: sorted(ids) for of, ids in by.items()} for kind, by in out.items()}


def _record_of(parents: Sequence[Mapping[str, Any]], under: Sequence[str]) -> tuple[str, int] | None:
    """(ledger kind, id) of the record among a placeholder's `parents` whose list served it: the
    first parent of a kind in `under`; None when there is none or its id is no positive integer."""
    for p in parents:
        kinds = p.get("kinds") or ()
        sid = str(p.get("id", ""))
        if kinds and kinds[0] in under and sid.isdigit() and int(sid) > 0:
            return kinds[0], int(sid)
    return None


def read_again(records: Mapping[str, Mapping[str, Sequence[int]]], parent_kind: str) -> list[Successor]:
    """The catch-up tasks reading `records` (`records_to_read`) again, but mail (its tasks are the
    catch-up's own, `catchup.mail_tasks`): a per-record kind's rechecks of `RECORDS_PER_TASK`
    records (`record_lists.RecordListTask`, which writes the rows served and marks the ones no
    longer served), a deal's lines `IDS_PER_CALL` deals a call (`lines.run_task`). Keyed by
    `parent_kind` and the batch's first record, so a task retried finds them made."""
    out: list[Successor] = []
    for kind, by in records.items():
        for of, ids in by.items():
            if kind in record_lists.FAMILIES:
                step = record_lists.RECORDS_PER_TASK
                out += [Successor(f"{kind}:retake-{parent_kind}:{of}:{ids[i]}",
                                  {"fanout": kind, "of": of, "records": list(ids[i:i + step]), "recheck": True})
                        for i in range(0, len(ids), step)]
            elif kind == lines.KIND:
                out += lines.catchup_tasks(f"retake-{parent_kind}", 0, ids)
    return out
