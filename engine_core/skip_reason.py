"""The words of a row's reasons about its parents: why a placeholder is not linked, and what an
imported row's dangling and owed links are.

A missing parent is named by what the engine knows of it, so the reason points the right way:

* held in the ledger as failed (`PageRefs.held_as`, read with the page's references):
  "organization 99 failed at import (`migrate explain` of organizations 99 says why)" - the
  parent's own reason is one command away, and the child's stays one line (no tenant in it: a
  reason is the same words whichever tenant's ledger holds it);
* answered by the probe as existing, though not written ("exists at the source but is not
  written"): when the parent's list served rows without a readable id, kept apart as failed
  (`PageRefs.kept_apart`), the reason says how many and where they are listed - such a row is
  served without the id its children point at, so it may well be the parent. When the source lists the parent's kind through several lists and the run does not take all of
  them (`untaken_lists`: the six kinds a plain loader picks take the active deals and leads, not
  the archived ones), the reason names the lists it did not take and the remedy - a run of those
  kinds, then a sync, which takes the placeholders over (a sync walks every list of the kinds the
  tenant took) - so a skipped activity of an archived deal says what to do, not only what is;
* left to the catch-up's walk: `WAITS_FOR_WALK`;
* else "organization 42 is not here" (`rows.Ref.describe`).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from engine_core.rows import WAITS_FOR_WALK, Ref

Pair = tuple[str, str]  # (ledger kind, source id)

NOT_LINKED = "not linked to any record"
# Said of a parent the source does not have: it answered 404 to GET by id, or left the id out of
# its v2 list asked with `ids=` (where absence is the answer). No status in the text: most are
# proven by a list, which answers 200 (and a parent gone with 410 is as gone as with 404).
DANGLING = "does not exist at the source"
NOT_WRITTEN = "exists at the source but is not written"
# Said after NOT_WRITTEN of a parent whose kind has lists the run did not take (`untaken_lists`).
UNTAKEN_MARK = "{kind} was not part of the run"
UNTAKEN = "{marks}: a run of `--kinds {kinds}`, then `migrate sync`, links it"
# Said of a soft link whose parent's kind the run does not take (`rows.owed_links`): the barrier
# fills it when a run writes that kind (`owed_links.fill`); verify counts the row as owed until then.
OWED = "is owed: {kind} not taken yet (a run of {kind} fills it)"
# Said of a soft link to a kind the run takes whose parent is not written as the row is
# (`pending_links`: a later phase's or page's, one left to the catch-up's walk): the run's end fills it.
OWED_TO_RUN = "is owed: {kind} not written yet (the run's end fills it)"
# Said of a parent the ledger holds as failed. Not of a skipped one: a dry run's skipped rows roll
# back with their savepoints, so its children could not say it, and its reasons must be a real run's.
HELD_AS = {"failed": "failed at import"}


def untaken_lists(lists: Mapping[str, tuple[str, ...]], taken: Collection[str]) -> dict[str, tuple[str, ...]]:
    """Per ledger kind the source lists through several kinds (`lists`: `source.ledger_lists`), the
    lists of it a run of kinds `taken` does not take, when it takes some: {"deals": ("deals_archived",)}
    for a run of the active deals alone. A parent of that kind the source has and the run did not
    write may be served by those alone (an archived deal)."""
    taken = set(taken)
    out = {lk: tuple(k for k in ks if k not in taken) for lk, ks in lists.items()}
    return {lk: left for lk, left in out.items() if left and len(left) < len(lists[lk])}


def untaken_said(kinds: tuple[str, ...]) -> str:
    """UNTAKEN for these lists: "deals_archived was not part of the run: a run of `--kinds
    deals_archived`, then `migrate sync`, links it" (each list's `untaken_mark`, then the remedy)."""
    return UNTAKEN.format(marks=", ".join(untaken_mark(k) for k in kinds), kinds=",".join(kinds))


def untaken_mark(kind: str) -> str:
    """The words a reason holds when it names the list `kind` as not taken (`untaken_said`): what
    the ledger is searched by for the rows that wait for that list (`ledger_reads.skipped_naming`)."""
    return UNTAKEN_MARK.format(kind=kind)


def describe_missing(ref: Ref, exists: Mapping[Pair, bool | None], held_as: Mapping[Pair, str] | None = None,
                     kept_apart: Mapping[str, int] | None = None,
                     untaken: Mapping[str, tuple[str, ...]] | None = None) -> str:
    """Why `ref`'s parent is not linked, in words (module docstring): `exists` the probe's answers,
    `held_as` the ledger's action of parents it holds unwritten, `kept_apart` per ledger kind the
    rows kept without a readable id, `untaken` per ledger kind the lists the run did not take
    (`untaken_lists`)."""
    pair = (ref.parent_kind, ref.source_id)
    noun = ref.noun or ref.ref
    held = (held_as or {}).get(pair)
    if held in HELD_AS:
        return (f"{noun} {ref.source_id} {HELD_AS[held]} "
                f"(`migrate explain` of {ref.parent_kind} {ref.source_id} says why)")
    if exists.get(pair) is True:
        n = (kept_apart or {}).get(ref.parent_kind, 0)
        apart = (f" - {n} {ref.parent_kind} row(s) were served without a readable id, kept apart as failed "
                 f"(`migrate rows --kind {ref.parent_kind} --action failed` lists them)") if n else ""
        lists = (untaken or {}).get(ref.parent_kind)
        remedy = f" - {untaken_said(lists)}" if lists else ""
        return f"{noun} {ref.source_id} {NOT_WRITTEN}{remedy}{apart}"
    if pair in exists and exists[pair] is None:
        return f"{ref.describe()}, {WAITS_FOR_WALK}"
    return ref.describe()


def not_linked(missing: Iterable[Ref], exists: Mapping[Pair, bool | None], held_as: Mapping[Pair, str] | None = None,
               kept_apart: Mapping[str, int] | None = None, untaken: Mapping[str, tuple[str, ...]] | None = None) -> str:
    """The reason a row whose parents are not written is skipped (a placeholder), one line
    (`describe_missing`'s words for each parent)."""
    words = [d for d in (describe_missing(ref, exists, held_as, kept_apart, untaken) for ref in missing) if d]
    return f"{NOT_LINKED}: " + "; ".join(words) if words else NOT_LINKED


# OWED said of each kind (OWED_TO_RUN of a pending link): a row of a run not taking users owes a few
_OWED_WORDS: dict[tuple[str, bool], str] = {}


def _owed(kind: str, pending: bool) -> str:
    words = _OWED_WORDS.get((kind, pending))
    if words is None:
        words = _OWED_WORDS[(kind, pending)] = (OWED_TO_RUN if pending else OWED).format(kind=kind)
    return words


def dangling_reason(refs: list[dict[str, Any]]) -> str | None:
    """An imported row's reason for its dangling and owed references (None: it has none)."""
    if not refs:
        return None
    return "imported; " + "; ".join([f"{r['field']} {r['parent_id']} "
                                     f"{_owed(r['parent_kind'], 'pending' in r) if r.get('owed') else DANGLING}" for r in refs])
