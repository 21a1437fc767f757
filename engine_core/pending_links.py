"""Soft links to a row the run takes but has not written as their row is written: owed to its end.

A soft link (`rows.Mapped.links`: an organization's custom field naming a person, a deal's naming a
person) is filled when its parent is written. One run of all kinds writes a row before some of the
rows it links to: a later phase's (persons after organizations), a later page's of the same kind, a
placeholder left to the catch-up's walk (a person on a deleted organization, written by the walk at
the run's end). Such a link, not found and to a kind the run takes, is recorded as owed
(`rows.Ref.owed`, with `"pending": true`; its words `skip_reason.OWED_TO_RUN`), and the barrier
finalising the run fills it from the ledger (`owed_links.fill`), as it fills a link owed to a kind an
earlier run left out. A parent the run did not write in the end (gone at the source, skipped, failed)
leaves the link empty and no longer owed once the run succeeds, as the ledger had nothing to fill it
with; a run that fails keeps it owed, for the run that takes the kind next. So one run of all kinds
links a row as runs split by kind (the parent's kind last: the links owed to it) do.

No query of its own: the page's references are read once already (`ledger.references`).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from engine_core import rows
from engine_core.rows import Mapped

Pair = tuple[str, str]  # (ledger kind, source id)


def pending_links(mapped: Iterable[Mapped | None], found: Mapping[Pair, int], kinds: Collection[str]) -> frozenset[Pair]:
    """The (parent kind, source id) of the soft links of `mapped` that are not written (not in
    `found`, under any of their ledger kinds) and whose parent kind is one of `kinds` (the run's:
    its end fills them); empty when there is none."""
    out: set[Pair] = set()
    kinds = frozenset(kinds)
    for m in mapped:
        if m is None:
            continue
        for ref in m.links:
            if ref.parent_kind in kinds and not any((k, ref.source_id) in found for k in ref.kinds):
                out.add((ref.parent_kind, ref.source_id))
    return frozenset(out)


def owed_to_run(ref: rows.Ref) -> dict[str, Any]:
    """What the ledger entry and the product row keep of a soft link owed to the run's end:
    `Ref.owed()` with `"pending": true` (its words: `skip_reason.OWED_TO_RUN`)."""
    return {**ref.owed(), "pending": True}


def owed_links(mapped: Mapped, record_ids: Sequence[int | None], taken: Collection[str],
               pending: Collection[Pair] = frozenset()) -> list[dict[str, Any]]:
    """The row's owed links: those to a kind the run does not take (`rows.owed_links`, same
    arguments), then those owed to the run's end (`pending`: the page's `pending_links`)."""
    owed = rows.owed_links(mapped, record_ids, taken)
    if not pending:
        return owed
    for ref, record_id in zip(mapped.links, record_ids[len(mapped.parents):]):
        if record_id is None and (ref.parent_kind, ref.source_id) in pending:
            owed.append(owed_to_run(ref))
    return owed
