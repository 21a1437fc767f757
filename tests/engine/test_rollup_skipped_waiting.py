"""Of the skipped rows a ledger kind holds beyond its phase's count (the catch-up's), those that were
rows the phase left waiting for the catch-up's walk are the ones the catch-up counted as it skipped
them (`caught_up["skipped_waiting"]`, `rows.SKIPPED_WAITING`), not as many of the phase's waiting
rows as there are: the rest are rows the phase never counted, added to `seen`
(`rollup_catchup.skipped_by_catchup`). The estimate it replaces (waiting rows first) moved every
waiting row it could, so `seen` read low and `left to catch-up` lost rows the catch-up imported."""
from __future__ import annotations

from engine_core import rollup_catchup
from engine_core.rollup import KindRollup


def _persons(**caught_up: int) -> KindRollup:
    # the phase: 100 seen, 95 imported, 5 left waiting; the catch-up met the 5 (and skipped 1 of them)
    return KindRollup(kind="persons", phase=0, tasks={"succeeded": 1}, seen=100, imported=95, waiting=5,
                      caught_up={"seen": 7, "imported": 4, "skipped": 3, **caught_up})


def test_the_waiting_rows_the_catch_up_skipped_are_those_it_counted() -> None:
    persons = _persons(again_waiting=5, skipped_waiting=1)
    # the ledger holds 3 skipped persons: 1 of the waiting rows, and 2 rows the phase never counted
    rollup_catchup.skipped_by_catchup([[persons]], {"persons": 3})
    assert (persons.skipped, persons.skipped_by_catchup, persons.waiting_skipped) == (3, 3, 1)
    assert persons.waiting == 4 and persons.seen == 102 == persons.accounted, persons
    assert persons.at_close().waiting == 5 and persons.at_close().seen == 100


def test_a_catch_up_that_kept_no_count_leaves_the_estimate() -> None:
    persons = _persons()  # its tasks' stats hold no `rows.AGAIN` count: the waiting rows take them first
    rollup_catchup.skipped_by_catchup([[persons]], {"persons": 3})
    assert (persons.waiting_skipped, persons.waiting, persons.seen) == (3, 2, 100)
