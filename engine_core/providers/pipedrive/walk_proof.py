"""Parents left to the catch-up's walk: a full run asks the source about no missing parent of a
row its catch-up will list again; the catch-up's walk settles them without a request.

A row whose parent the ledger does not know, listed by a walk before the catch-up (a full run's
phases), is a placeholder that waits for the catch-up's walk (`write.WAITS_FOR_WALK`, at the row's
version) instead of asking the source (`writers.ask_source`) - when the run's catch-up lists the
row's kind and every list of the parent's ledger kind whole and writes the parent's lists first
(`walk_settles`: a full run, not dry; a sync, whose listing may be only what changed, and a
dry run, whose catch-up writes nothing, ask as before). The catch-up's walk then takes the
placeholder over (`inventory_ledger.needs_write`): a parent its chain wrote links it; a parent it
did not list is gone, and the row is imported with that link dangling exactly as a 404 leaves
it, without a request (`settled_by_walk`).

The proof. A child listed at time t references parent X, so X existed at t (Pipedrive keeps a
child's reference after its parent was deleted: or X was deleted before t). The catch-up's walk of
X's lists starts after every page of the run's walks was listed (the catch-up is the run's last
phase), so after t. If X still existed when that walk started, the walk lists it: a row present
for the whole walk is served at least once (`inventory.py`: v2 lists by cursor, which updates and
deletions elsewhere do not move; v1 lists by overlapping offsets), and the lists of one ledger kind
are read one after the other (archived deals after deals), so a deal archived while they are walked
is served by the second. So if the catch-up's complete walk did not list X (X is not in the run's
inventory, `inventory_ledger.unlisted`), X is gone. (Its one gap is the walk's own: a deal or lead
restored from the archive between the walks of its two lists is in neither; its child then keeps
the link dangling, as the catch-up itself misses that parent until the next sync.) The proof needs the reference seen at t:
it holds only for a child the catch-up lists at the version the earlier walk skipped it at
(`inventory_ledger.waiting_at`: same version, same reference) and whose every row pointing at X
on the page is such a child; a child changed since, or first listed by the catch-up itself, is
asked as before (few rows). The catch-up writes a kind's rows only after the walks of its
parents' lists are written (one chain, parents first; the last level after the chain):
`walk_settles` checks the order of `kinds.CATCHUP_ORDER`. Nothing of it is remembered in memory
(`writers.SourceAnswers`): a resumed run's catch-up, in any process, settles the placeholders a
run stopped before its catch-up left.

A run that imports one list of a ledger kind and not the other (deals but not archived deals: the
six kinds a plain loader reads) has its catch-up walk the other list too, only to settle parents
(`proof_lists`): an activity's deal that neither list served is gone (imported with the link
empty), one only the list the run does not import served exists and is not written (the activity
stays a placeholder saying so) - the answers asking would give, for a page per 500 rows of that list
instead of a question per page that names one (`settled_by_walk`).

A deal left waiting has its mail left to the catch-up too (`mail_left_to_catchup`): the catch-up
writes the deal (a placeholder is always taken over) and lists the mail of every deal it writes
whose `email_messages_count` exceeds the mail held (`catchup.mail_wanted`), so the emails phase
listing it first would pay that listing twice. Its other fan-outs need nothing: deal products,
participants, followers and history are read for the deals the ledger holds written
(`holdings.written_ids`), which a placeholder is not.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from engine_core import inventory_ledger, write
from engine_core.context import TaskContext
from engine_core.models import Run
from engine_core.providers.pipedrive.kinds import BY_NAME, KINDS, LAST_LEVEL, ledger_kind

Pair = tuple[str, str]  # (ledger kind, source id)


# The catch-up's lists of each ledger kind (an archived list keeps its kind's identities).
WALKED_LISTS: dict[str, tuple[str, ...]] = {
    lk: tuple(k.name for k in KINDS if k.catchup is not None and k.ledger == lk)
    for lk in {k.ledger for k in KINDS if k.catchup is not None}}


# Kinds the catch-up does not walk, with the ledger kinds of the records whose rows of them it reads
# again when it writes such a record (`record_lists.catchup_tasks`' `of`, `lines.catchup_tasks`,
# the mail tasks' retake, the changed files' contents): a row of them on a record left waiting is
# taken over there. Any other parent of theirs left waiting would not be (a participant's person).
RECHECKED: dict[str, tuple[str, ...]] = {
    "participants": ("deals",), "followers": ("deals", "persons", "organizations"), "deal_history": ("deals",),
    "emails": ("deals",), "deal_products": ("deals",), "file_contents": ("files",)}


def _read_again(kinds: Collection[str], lk: str) -> bool:
    """Whether every kind of `kinds` the catch-up does not walk that points at records of ledger kind
    `lk` reads its rows again when the catch-up writes such a record (`RECHECKED`)."""
    for name in kinds:
        k = BY_NAME.get(name)
        if k is None or k.catchup is not None:
            continue
        if lk in {ledger_kind(d) for d in k.depends_on} and lk not in RECHECKED.get(name, ()):
            return False
    return True


def proof_lists(kinds: Collection[str]) -> tuple[str, ...]:
    """The lists a full run's catch-up walks only to settle parents (in `kinds.CATCHUP_ORDER`): the
    other lists of a ledger kind one of whose lists the run imports (`kinds` holds `deals` but not
    `deals_archived`: the archived deals). A parent of that kind missing from the ledger is then
    settled by the walk like any other (module docstring): not served by either list, it is gone;
    served only by a list the run does not import, it exists and is not written (its child stays a
    placeholder saying so) - one walk of the list (a page per 500 rows: the seed customer's 4,960
    archived deals are 10 pages) instead of an `ids=` probe of both deal lists per page that names
    one (two lists, 30 tokens) or a `GET` per lead (leads take no `ids`; 3,443 `GET /v1/leads/{id}`
    on the seed customer's six kinds). Its rows are written only when the ledger holds them already
    (`catchup.write_changed`'s `proof`: a deal the run wrote, archived since), as the kind's
    deletes task would have written them when asked by id. It also spares that deletes task its `GET`
    by id of every record of the kind an earlier run wrote from the other list (a run of the archived
    deals alone, after one of the active deals, asked each of 1,101 active deals: one list page per
    500 instead)."""
    imported = set(kinds)
    return tuple(name for name, k in sorted(BY_NAME.items(), key=lambda kv: kv[1].catchup or 0)
                 if k.catchup is not None and name not in imported
                 and any(other in imported for other in WALKED_LISTS[k.ledger]))


def left_to_catchup(kinds: Collection[str], kind: str, parent_kind: str) -> bool:
    """Whether a full run of `kinds` leaves a missing parent of ledger kind `parent_kind` of a row of
    listing kind `kind` to its catch-up's walk: `kind` walked by the catch-up, and every list of the
    parent's ledger kind walked - and written - before `kind`'s list in its chain
    (`kinds.CATCHUP_ORDER`; the last level after the chain) - and no kind of the run the catch-up
    does not walk points at `kind`'s rows without reading them again (`_read_again`: a participant
    skipped on a person left waiting would stay skipped). For the plan too (`estimate`)."""
    child = BY_NAME.get(kind)
    lists = WALKED_LISTS.get(parent_kind, ())
    if child is None or child.catchup is None or kind not in kinds or not lists:
        return False
    if not _read_again(kinds, ledger_kind(kind)):
        return False
    proof = proof_lists(kinds)
    return all((name in kinds or name in proof) and name not in LAST_LEVEL
               and (BY_NAME[name].catchup or 0) < child.catchup for name in lists)


def walk_settles(run: Run, kind: str, parent_kind: str) -> bool:
    """Whether the run's catch-up walk settles a missing parent of ledger kind `parent_kind` of a
    row of listing kind `kind` without a request (module docstring): `left_to_catchup`, in a full
    run, not dry (its catch-up walks every list whole and writes). A sync, whose listing may be
    only what changed, and a dry run keep asking."""
    return not run.is_sync and not run.dry_run and left_to_catchup(run.kinds, kind, parent_kind)


def settled_by_walk(ctx: TaskContext, kind: str, prepared: Sequence[write.Prepared], pairs: Iterable[Pair],
                    *, gone: bool = True) -> dict[Pair, bool]:
    """The parents among `pairs` of a catch-up page of listing kind `kind` (`prepared`) that its walk
    settles without a request, with the answer a probe would give: `walk_settles`, and every row of
    the page pointing at the parent waits for the catch-up's walk at the version listed now
    (`inventory_ledger.waiting_at`: the reference a walk before the catch-up saw). `gone`: those this
    run's inventory does not hold (no page of the catch-up's walk served them: gone at the source,
    False) and those a page of it served though the ledger does not know them (served by a list the
    run walks only to settle parents, `proof_lists`: there, True); False: all of them, unanswered
    (asked before the parents' walks are done: `LastParents`, which only leaves them unasked).
    Reads the ledger; holds no connection after."""
    pairs = sorted(p for p in set(pairs) if walk_settles(ctx.run, kind, p[0]))
    if not pairs:
        return {}
    pointing: dict[Pair, set[str]] = {p: set() for p in pairs}
    versions: dict[str, str | None] = {}
    for row in prepared:
        m = row["mapped"]
        for ref in m.parents if m is not None else ():
            if (ref.parent_kind, ref.source_id) in pointing:
                pointing[(ref.parent_kind, ref.source_id)].add(m.source_id)
                versions[m.source_id] = m.version
    with ctx.db.connection() as conn:
        waiting = inventory_ledger.waiting_at(conn, ctx.run, ledger_kind(kind), versions.items())
        if gone:
            unlisted, served = inventory_ledger.listed(conn, ctx.run, pairs)
        else:
            unlisted, served = set(pairs), set()
    settled = [p for p in pairs if pointing[p] and pointing[p] <= waiting]
    return {p: p not in unlisted for p in settled if p in unlisted or p in served}


def mail_left_to_catchup(ctx: TaskContext, deals: Collection[int]) -> set[int]:
    """The deals among `deals` (source ids) whose mail the run's catch-up lists, so the emails phase
    does not (module docstring): deals the ledger holds waiting for the catch-up's walk, in a full
    run, not dry, whose catch-up walks a deal list (it writes them and seeds their mail tasks). A
    sync's and a dry run's catch-up seed no such listing: none there. Reads the ledger."""
    run = ctx.run
    if run.is_sync or run.dry_run or not deals or not any(k in run.kinds for k in WALKED_LISTS.get("deals", ())):
        return set()
    with ctx.db.connection() as conn:
        held = inventory_ledger.waiting(conn, run, "deals", (str(d) for d in deals))
    return {d for d in deals if str(d) in held}
