"""What a run's figures say of the rows a phase left unlisted to the catch-up: one line per kind.

A phase may leave a whole parent's rows to the catch-up without listing them (Pipedrive: the mail
of a deal that waits for the catch-up's walk, which writes the deal and then lists its mail once).
Those rows were never seen by the phase: they are no `seen` and no `waiting` rows (no ledger row
holds them, so `migrate rows --action waiting` could not list them), and the catch-up counts them
when it lists them (`by catch-up`). What is true of them is the parents: "the emails of 23 deals
were left to the catch-up", from the kind's `KindRollup.left` (the "left_to_catchup:<parent>" task
stats, `rows.LEFT_TO_CATCHUP`). Before the catch-up has closed the line says it will list them;
after, that it did - nothing of them reads as pending once it ran.
"""
from __future__ import annotations

from engine_core.rollup import KindRollup, RunRollup


def catchup_done(r: RunRollup) -> bool:
    """Whether the run's last phase (the catch-up) has closed: it succeeded, or its barrier passed."""
    return r.status == "succeeded" or r.current_phase >= len(r.phases)


def left_line(r: RunRollup, k: KindRollup) -> str | None:
    """One kind's line, or None when its tasks left nothing to the catch-up, e.g. "emails of 23
    deals left to the catch-up (those deals wait for its walk): it lists them once it has written
    the deals; not rows of this phase, so not counted seen or waiting"."""
    if not k.left:
        return None
    parents = ", ".join(f"{n} {_one(parent) if n == 1 else parent}" for parent, n in sorted(k.left.items()))
    if catchup_done(r):
        return (f"{k.kind} of {parents} left to the catch-up (those records waited for its walk): it wrote them and "
                f"listed their {k.kind} (counted `by catch-up`)")
    resume = f"; `migrate run --tenant {r.tenant_id}` resumes the run" if r.status == "stopped" else ""
    return (f"{k.kind} of {parents} left to the catch-up (those records wait for its walk): it lists them once it "
            f"has written the records; not rows of this phase, so not counted seen or waiting{resume}")


def _one(kind: str) -> str:
    """A kind's name for one record: "deals" -> "deal" (a name not ending in a plain "s" as it is)."""
    return kind[:-1] if kind.endswith("s") and not kind.endswith(("ies", "ss")) else kind


def left_lines(r: RunRollup, kind: str | None = None, phase: int | None = None) -> list[str]:
    """The lines of every kind (or of `kind`, or of the kinds of `phase`) that left rows to the catch-up."""
    chosen = [k for k in r.kinds if (kind is None or k.kind == kind) and (phase is None or k.phase == phase)]
    return [line for line in (left_line(r, k) for k in chosen) if line]
