"""Reading ahead of a run's listing tasks: the pages a walk will ask for, asked while earlier pages
are written (`listing.ask_ahead`, `AHEAD` pages deep), the next phase's first pages
(`listing.ask_next_phase`, `listing.ask_discoveries`) and, once the phases of their parents are
closed, the parents those pages' probes would ask (`writers.probe_ahead`). All of it through the run's `prefetch.Prefetch`
store in this process and its answers (`writers.SourceAnswers`): only a cache - what a task
writes, its checkpoint, cursor and ledger stay its own.

An early discovery (run while the phase before its own ends) also asks the first pages of the
phase after its own (`listing.ask_discoveries`, `next_phase`): two phases ahead, so that phase's
discoveries and v1 walkers start with their first page here.

The bound on waste, when a page asked ahead is not taken here (its task runs in another process,
as with a multi-process executor, the run stops, or the page outlives the store's `ttl`): `AHEAD`
pages a walker plus the page its discovery holds, one first page a v1 kind of the next phase and
walker end, one first page a kind of the phase after an early discovery's, and none of their
probes (a page's parents are asked only once its phases run in this process). Nothing is asked for a
phase after the last one the launch executes (`Settings.launch_last_phase`: a Dagster run whose
selection ends before it): no task of this launch would take it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_core.context import TaskContext
from engine_core.models import Run, Successor
from engine_core.providers.pipedrive import kinds, writers
from engine_core.providers.pipedrive.listing import AHEAD, Arrived, ask_ahead, ask_discoveries, ask_next_phase
from engine_core.providers.pipedrive.meter import CountingClient
from engine_core.providers.pipedrive.prefetch import Prefetch


def ask_fields(client: Any) -> None:
    """Ask the first page of every field list now (`kinds.V2_FIELD_LISTS`, `V1_FIELD_LISTS`,
    through the client's `Prefetch`, each once a run): the requests the run's field book will make
    (`PipedriveProvider.fetch_definitions`), answered by the time its first page is mapped."""
    for path in kinds.V2_FIELD_LISTS.values():
        client.prefetch_v2(path, once=True)
    for path in kinds.V1_FIELD_LISTS.values():
        client.prefetch_v1(path, once=True)


def ready_phase(run: Run, phase: int) -> int:
    """The first phase of `run` in which the parents of a page of `phase` can be asked about: the
    one after the last earlier phase holding a kind the source is asked about by id
    (`kinds.PARENT_PATHS`), whose rows are all written by then; at most `phase`."""
    asked = [p for p, group in enumerate(run.plan[:phase])
             if any(kinds.ledger_kind(k) in kinds.PARENT_PATHS for k in group)]
    return max(asked, default=-1) + 1


class Ahead:
    """What one listing task asks ahead. `source`: the provider's client (requests asked ahead are
    counted by `count`, not by the task's own counter) and `store` its run's pages asked ahead
    (None: nothing is asked ahead); `mapper_of(kind)`: a kind's row mapper; `seeds_of(run, kind)`:
    the provider's first tasks of a kind."""

    def __init__(self, ctx: TaskContext, source: Any, store: Prefetch | None, mapper_of: Callable[[str], Any],
                 seeds_of: Callable[[Run, str], list[Successor]]) -> None:
        self.ctx = ctx
        self.source = source
        self.mapper_of = mapper_of
        self.seeds_of = seeds_of
        self.store = store

    def walk(self, client: Any, successors: tuple[Successor, ...]) -> None:
        """A walker's task: its phase runs here (`Prefetch.opened`); its successors' pages asked
        ahead with their parents (`hook`); at its last page, the next phase's v1 first pages."""
        task = self.ctx.task
        if self.store is None:
            return
        self.store.opened(task.phase)
        ask_ahead(client, task.kind, successors, arrived=self.hook(task.kind, task.phase))
        if not successors:
            self.next_phase(self.ctx.task.phase, client)

    def discovered(self, client: Any, seeds: tuple[Successor, ...]) -> None:
        """A discovery's walkers: their first pages (one held by the discovery) and `AHEAD` more.
        A discovery run early (its phase not seeded yet, so the phase after has no discoveries
        yet either: `barrier.seed_phase`) also asks that phase's discoveries' first pages
        (`ask_discoveries`) and its v1 lists' (`next_phase`): two phases ahead of the phase that
        runs now. A later one asks nothing more: that phase's own discoveries are at work."""
        if self.store is None:
            return
        task = self.ctx.task
        ask_ahead(client, task.kind, seeds, depth=AHEAD + 1, arrived=self.hook(task.kind, task.phase))
        if self.ctx.run.current_phase < task.phase and self.reaches(task.phase + 1):
            ask_discoveries(client, self.ctx.run, task.phase)
            self.next_phase(task.phase, client)

    def reaches(self, phase: int) -> bool:
        """Whether the launch driving this task executes `phase` (`Settings.launch_last_phase`)."""
        last = self.ctx.settings.launch_last_phase
        return last is None or phase <= last

    def next_phase(self, phase: int, client: Any) -> None:
        """The first pages of the v1 kinds of the phase after `phase`, with their parents (`hook`);
        none when the launch ends before that phase (`reaches`)."""
        if not self.reaches(phase + 1):
            return
        ask_next_phase(client, self.ctx.run, phase, self.seeds_of, arrived=lambda kind: self.hook(kind, phase + 1))

    def hook(self, kind: str, phase: int) -> Arrived:
        """For pages of `kind` (in `phase`) asked ahead: once one arrives and the phases of the
        kinds its rows may ask about are closed (`ready_phase`: a task of that phase runs in this
        process, `Prefetch.when_open`), its parents the ledger does not know are asked of the source
        (`writers.probe_ahead`), so its task finds them answered; its requests wait in the store
        for the next task of `kind` to count (`count`). Only while the source is slow
        (`Prefetch.slow`): on a fast one the page is only mapped (`writers.map_ahead`, on the store's
        thread, while the lanes' statements run in Postgres) for its task to take, as it arrives
        once its own phase runs here (a mapper needs the run's field book, read in an earlier phase).
        At a walker's last page asked ahead, the next phase's v1 first pages are asked too."""
        ready = ready_phase(self.ctx.run, phase)
        own = kind == self.ctx.task.kind
        store = self.store
        if store is None:
            return lambda rows, last: None

        def probe(rows: tuple[dict[str, Any], ...]) -> None:
            counting = CountingClient(self.source)
            try:
                writers.probe_ahead(self.ctx, counting, rows, self.mapper_of(kind), kind)
            finally:
                store.count(kind, counting.requests, counting.tokens)

        def arrived(rows: tuple[dict[str, Any], ...], last: bool) -> None:
            if store.slow():
                store.when_open(ready, lambda: probe(rows))
            else:  # once the page's phase runs here: the phases before it (the field book's) are closed
                store.when_open(phase, lambda: writers.map_ahead(rows, self.mapper_of(kind)))
            if last and own:
                self.next_phase(phase, self.source)

        return arrived

    def count(self) -> None:
        """Count in the task's stats what was asked ahead for its kind and not counted yet."""
        if self.store is None:
            return
        requests, tokens = self.store.uncounted(self.ctx.task.kind)
        self.ctx.stats.bump("requests", requests)
        self.ctx.stats.bump("tokens", tokens)
