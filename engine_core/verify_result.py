"""What a proof from the source found (`verify.verify`): per ledger kind its counts and the ids of
each difference (`KindResult`), and for the tenant the verdict, its lines and its JSON form
(`VerifyResult`). The rules that decide the differences are `verify`'s (its module docstring)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DIFFERENCES = ("missing", "extra", "duplicated", "stale", "takeable", "owed")
TAKEABLE_WHY = (" - skipped, but every parent they were skipped for is written now: not a settled skip; "
                "`migrate sync {tenant}` takes them")
OWED_WHY = (" - imported with that link empty: no run of the tenant took {kind}; "
            "`migrate run --tenant {tenant} --kinds {kind}` fills them")
DISPLAY_CAP = 10  # ids shown per difference in the text form; the JSON form carries all of them
# A ledger kind whose rows are listed through a parent record: the children of a parent served
# without a readable id are kept as one record, keyed by this word and the parent's key
# ("deal sha256:...": the mail of a deal), and listed so (module docstring).
KEPT_FOR_PARENT: dict[str, str] = {"emails": "deal"}


@dataclass
class KindResult:
    """One ledger kind: counts (rows) and the source ids of each difference, sorted."""

    kind: str
    listed_as: tuple[str, ...]  # the provider kinds whose listings fold into this ledger kind
    source: int = 0  # ids the source lists now
    # every live entry the ledger holds for the kind: `imported` and the placeholders (skipped,
    # failed, waiting: the rows `migrate rows` lists), marked-deleted claims apart (`deleted_marked`)
    ledger: int = 0
    imported: int = 0  # of those, live claims (created or matched, not marked deleted at the source)
    unlisted_placeholders: int = 0  # of those, placeholders whose row the source no longer lists
    product: int = 0  # source ids with a live product row
    unwritten: int = 0  # source ids the ledger accounts for as skipped or failed (or waiting)
    waiting: int = 0  # of those, placeholders waiting for the catch-up's walk (`rows.WAITS_FOR_WALK`)
    skipped: int = 0  # of those, skipped with a reason (not waiting)
    failed: int = 0  # of those, failed (rows without a readable id included)
    unwritten_ids: list[str] = field(default_factory=list)
    deleted_marked: int = 0  # ledger rows marked deleted at the source
    unversioned: int = 0  # ledger rows without a source version (not compared)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    # skipped rows whose every missing parent is written now: the engine can still take them
    takeable: list[str] = field(default_factory=list)
    # written rows with a link owed to a kind a run took since, which that run did not fill
    owed: list[str] = field(default_factory=list)
    # written rows with a link owed to a kind no run took (`owed_links`): parent kind -> ids; not a difference
    owed_to: dict[str, list[str]] = field(default_factory=dict)
    # matched rows (the product's own) whose source is newer, not overwritten: not a difference
    kept: list[str] = field(default_factory=list)
    # items whose children the source refuses to list ("deal 12" -> reason): not a difference
    unreachable: dict[str, str] = field(default_factory=dict)
    # rows served without a readable id, by their raw keys ("abc sha256:...", "sha256:..."): among
    # `source` and `unwritten`, one each, said apart
    not_ids: list[str] = field(default_factory=list)
    checked: bool = True
    note: str = ""

    @property
    def differences(self) -> int:
        """How many differences the kind has (missing, extra, stale and the like together)."""
        return sum(len(getattr(self, d)) for d in DIFFERENCES)

    def as_dict(self) -> dict[str, Any]:
        """The kind's result as a plain dict (`migrate verify --json`, Dagster metadata)."""
        return {
            "kind": self.kind, "listed_as": list(self.listed_as), "checked": self.checked, "note": self.note,
            "source": self.source, "ledger": self.ledger, "imported": self.imported,
            "unlisted_placeholders": self.unlisted_placeholders, "product": self.product, "unwritten": self.unwritten,
            "waiting": self.waiting, "skipped": self.skipped, "failed": self.failed,
            "deleted_marked": self.deleted_marked, "unversioned": self.unversioned,
            "unwritten_ids": list(self.unwritten_ids), "kept": list(self.kept), "unreachable": dict(self.unreachable),
            "not_ids": list(self.not_ids), "owed_to": {k: list(v) for k, v in self.owed_to.items()},
            **{d: list(getattr(self, d)) for d in DIFFERENCES},
        }


@dataclass
class VerifyResult:
    """The verdict for one tenant: per ledger kind, and what proving it cost.

    `passed`: at least one kind checked and no difference (kinds the source cannot list are shown
    as not checked). `requests` / `tokens`: what the listings spent
    at the source (tokens as the API charges them, `x-token-cost` per request); `seconds`: wall time."""

    tenant_id: str
    source: str
    kinds: list[KindResult]
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    unfinished: str | None = None  # `unfinished_run_line` of the tenant's latest run, said first

    @property
    def differences(self) -> int:
        """Differences over every kind."""
        return sum(k.differences for k in self.kinds)

    @property
    def left_out(self) -> bool:
        """True when every kind asked for is a kind no run of the tenant took (`left_out_kinds`):
        nothing to prove, and nothing missing."""
        return bool(self.kinds) and all(not k.checked and k.note.startswith("left out") for k in self.kinds)

    @property
    def passed(self) -> bool:
        """True when the source could list at least one kind and nothing differs, or when every
        kind asked for was left out (`left_out`)."""
        return (any(k.checked for k in self.kinds) or self.left_out) and self.differences == 0

    def accounted(self) -> dict[str, int]:
        """What the source's rows of the checked kinds are, in rows: {"source", "in_product" (a live
        product row), "skipped", "failed", "waiting"} - the last three kept in the ledger with a
        reason and not in the product, which a PASSED accounts for but does not import."""
        checked = [k for k in self.kinds if k.checked]
        return {"source": sum(k.source for k in checked), "in_product": sum(k.product for k in checked),
                **{n: sum(getattr(k, n) for k in checked) for n in ("skipped", "failed", "waiting")}}

    def verdict(self) -> str:
        """The verdict in words. PASSED says what passed: every source row is accounted for, and
        how many of them are not in the product (skipped, failed, waiting: `accounted`) with where
        their reasons are - or, when none, that every row is in the product. FAILED says how many
        differences (or that no kind could be listed)."""
        if not self.passed:
            return (f"FAILED: {self.differences} difference(s)" if self.differences
                    else "FAILED: the source could list no kind")
        owed = sorted({p for k in self.kinds for p in k.owed_to})
        owed_said = f" (links owed to {', '.join(owed)}, a kind no run took: see above)" if owed else ""
        if not any(k.checked for k in self.kinds):
            return "PASSED" + owed_said
        a = self.accounted()
        out = [f"{a[n]:,} {word}" for n, word in (("skipped", "skipped"), ("failed", "failed"),
                                                  ("waiting", "waiting for the catch-up")) if a[n]]
        if not out:
            return f"PASSED: every source row is in the product ({a['in_product']:,}){owed_said}"
        listed = out[0] if len(out) == 1 else ", ".join(out[:-1]) + " and " + out[-1]
        return (f"PASSED: every source row is accounted for - {a['in_product']:,} in the product, {listed} "
                f"{'is' if sum(a[n] for n in ('skipped', 'failed', 'waiting')) == 1 else 'are'} not "
                f"(kept with their reasons: `migrate rows {self.tenant_id}`){owed_said}")

    def as_dict(self) -> dict[str, Any]:
        """The result as a plain dict (`migrate verify --json`, Dagster metadata): `verdict` the
        line's words, `accounted` its counts."""
        return {"tenant": self.tenant_id, "source": self.source, "passed": self.passed, "unfinished": self.unfinished,
                "verdict": self.verdict(), "accounted": self.accounted(),
                "differences": self.differences, "requests": self.requests, "tokens": self.tokens,
                "seconds": round(self.seconds, 2), "kinds": [k.as_dict() for k in self.kinds]}

    def cost_line(self) -> str:
        """What the proof cost: requests and tokens spent at the source and wall seconds."""
        return f"cost: {self.requests} requests, {self.tokens} tokens, {self.seconds:.1f} s"

    def lines(self, cap: int = DISPLAY_CAP) -> list[str]:
        """The verdict in words: one line per kind, one per difference (ids capped at `cap`), the cost."""
        out = [self.unfinished] if self.unfinished else []
        for k in self.kinds:
            if not k.checked:
                out.append(f"{k.kind}: {k.note}" if k.note.startswith("left out") else f"{k.kind}: not checked ({k.note})")
                continue
            extra = ""
            if k.skipped or k.failed or k.unlisted_placeholders:
                extra += f" (reasons: `migrate rows {self.tenant_id} --kind {k.kind}`)"
            extra += (f" (`migrate rows {self.tenant_id} --action waiting`)" if k.waiting else "")
            extra += f", {k.deleted_marked} marked deleted" if k.deleted_marked else ""
            extra += f", {k.unversioned} without version" if k.unversioned else ""
            extra += f", {len(k.unreachable)} unreachable at the source" if k.unreachable else ""
            verdict = "ok" if not k.differences else f"{k.differences} difference(s)"
            out.append(f"{k.kind}: source {k.source}, ledger {k.ledger}{ledger_parts(k)}, product {k.product}{extra}: "
                       f"{verdict}")
            for d in DIFFERENCES:
                ids = getattr(k, d)
                if ids:
                    shown = ", ".join(ids[:cap]) + (f" ... (+{len(ids) - cap})" if len(ids) > cap else "")
                    out.append(f"  {d} {len(ids)}: {shown}" + (TAKEABLE_WHY.format(tenant=self.tenant_id)
                                                                 if d == "takeable" else ""))
            for parent, ids in sorted(k.owed_to.items()):
                shown = ", ".join(ids[:cap]) + (f" ... (+{len(ids) - cap})" if len(ids) > cap else "")
                out.append(f"  owed to {parent} {len(ids)}: {shown}" + OWED_WHY.format(tenant=self.tenant_id, kind=parent))
            if k.unreachable:
                items = sorted(k.unreachable, key=lambda i: (len(i), i))
                shown = ", ".join(f"{i} ({k.unreachable[i]})" for i in items[:cap])
                out.append(f"  unreachable {len(items)}: {shown}" + (f" ... (+{len(items) - cap})" if len(items) > cap else ""))
            if k.not_ids:
                shown = ", ".join(repr(i) for i in k.not_ids[:cap]) + (f" ... (+{len(k.not_ids) - cap})"
                                                                     if len(k.not_ids) > cap else "")
                word = KEPT_FOR_PARENT.get(k.kind)
                parents = sum(1 for i in k.not_ids if word and i.startswith(word + " "))
                of_parents = (f" ({parents} of them a {word} served so, whose {k.kind} cannot be listed: one key "
                              f"a {word}, its reason there says how many the source reports)" if parents else "")
                out.append(f"  without a readable id {len(k.not_ids)}: {shown}: served by the source without an id "
                           f"or with one that is not one{of_parents}, each counted in the source's {k.source} under "
                           f"its own key and kept apart as failed "
                           f"(`migrate rows {self.tenant_id} --kind {k.kind} --action failed`)")
            if k.kept:
                shown = ", ".join(k.kept[:cap]) + (f" ... (+{len(k.kept) - cap})" if len(k.kept) > cap else "")
                out.append(f"  kept {len(k.kept)} (matched, source newer, not overwritten: run with "
                           f"overwrite_matched to take them): {shown}")
        out.append(f"verify {self.tenant_id} ({self.source}): {self.verdict()}; {self.cost_line()}")
        return out


def ledger_parts(k: KindResult) -> str:
    """What a kind's ledger figure is made of, for its line: " (44 imported, 4 skipped, 2 failed, 1
    waiting for the catch-up's walk)" - the skipped, failed and waiting counts of rows the source
    lists, the verdict's; placeholders of rows it no longer lists said apart - so the ledger figure
    is the sum of the parts `migrate rows` and the verdict name; "" when the ledger holds imported
    rows only."""
    if not (k.skipped or k.failed or k.waiting or k.unlisted_placeholders):
        return ""
    parts = [f"{k.imported} imported"] + [f"{n} {word}" for n, word in (
        (k.skipped, "skipped"), (k.failed, "failed"), (k.waiting, "waiting for the catch-up's walk"),
        (k.unlisted_placeholders, "skipped/failed no longer listed by the source")) if n]
    return f" ({', '.join(parts)})"
