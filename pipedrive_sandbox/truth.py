"""What the account holds, for reconciliation (`GET /_sandbox/truth`): ids per kind, mail per deal,
malformed rows, dangling references."""
from __future__ import annotations

from typing import Any

from .hashing import S_DANGLE, S_MALFORMED
from .kinds import DANGLING_KINDS, KIND_CODE, MALFORMABLE_KINDS, REF_FIELDS, index_to_id


class Truth:
    """The truth queries of `Dataset` (mixed into it)."""

    TRUTH_KINDS: tuple[str, ...] = (
        "users",
        "organizations",
        "persons",
        "deals",
        "deals_archived",
        "leads",
        "leads_archived",
        "activities",
        "notes",
        "mail_messages",
        "pipelines",
        "stages",
    )

    def truth_ids(self, name: str) -> list[Any]:
        """The ids of truth kind `name` (e.g. `deals` active, `deals_archived`), in id order."""
        if name == "deals":
            return [self.ident("deals", i) for i in self.indexes("deals", "active")]
        if name == "deals_archived":
            return [self.ident("deals", i) for i in self.indexes("deals", "archived")]
        if name == "leads":
            return [self.ident("leads", i) for i in self.indexes("leads", "active")]
        if name == "leads_archived":
            return [self.ident("leads", i) for i in self.indexes("leads", "archived")]
        if name == "mail_messages":
            return list(range(1, self.message_total + 1))
        return [self.ident(name, i) for i in range(self.counts[name])]

    def deals_with_mail(self) -> dict[str, list[int]]:
        """{deal id as text: [its message ids]} for every deal with mail."""
        out: dict[str, list[int]] = {}
        for j, d in enumerate(self.mail_deal_index):
            out[str(index_to_id("deals", d))] = list(range(self.mail_prefix[j] + 1, self.mail_prefix[j + 1] + 1))
        return out

    def malformed(self, rate: float) -> dict[str, list[dict[str, Any]]]:
        """Per malformable kind, the rows served malformed at `rate`: [{id, position, variant}]."""
        out: dict[str, list[dict[str, Any]]] = {}
        for kind in MALFORMABLE_KINDS:
            rows = []
            if rate > 0:
                n = self.message_total if kind == "mail_messages" else self.counts[kind]
                code = KIND_CODE[kind]
                for i in range(n):
                    if self._u(S_MALFORMED, code, i) < rate:
                        rows.append({"id": self.ident(kind, i), "position": i, "variant": self.malformed_variant(kind, i)})
            out[kind] = rows
        return out

    def dangling(self) -> dict[str, list[Any]]:
        """Per dangling kind, the ids of the rows that reference a parent that no longer exists."""
        out: dict[str, list[Any]] = {}
        for kind in DANGLING_KINDS:
            code = KIND_CODE[kind]
            rate = self.spec.dangling_rate
            ids = []
            for i in range(self.counts[kind]):
                if self._u(S_DANGLE, code, i) < rate:
                    ids.append(self.ident(kind, i))
            out[kind] = ids
        return out

    def dangling_refs(self) -> dict[str, list[dict[str, Any]]]:
        """Per child kind, every reference to a purged parent: {"id": child id, "field": "org_id",
        "parent_kind": "organizations", "parent_id": the id GET answers 404 for}. Read from the
        served records themselves, so it says exactly what a consumer sees."""
        out: dict[str, list[dict[str, Any]]] = {}
        for kind in DANGLING_KINDS:
            code = KIND_CODE[kind]
            refs: list[dict[str, Any]] = []
            for i in range(self.counts[kind]):
                if self._u(S_DANGLE, code, i) >= self.spec.dangling_rate:
                    continue
                rec = self.record(kind, i)
                for field_name, parent in REF_FIELDS[kind]:
                    value = rec.get(field_name)
                    if value is not None and self.index_of(parent, value) is None:
                        refs.append({"id": self.ident(kind, i), "field": field_name, "parent_kind": parent, "parent_id": value})
            out[kind] = refs
        return out

    def truth(self, badrow_rate: float = 0.0, kind: str | None = None) -> dict[str, Any]:
        """Reconciliation facts; `kind` limits the answer to one entry (a truth kind, or
        `deals_with_mail`, `malformed`, `dangling`, `dangling_refs`, `counts`)."""
        wanted = [kind] if kind else list(self.TRUTH_KINDS) + ["deals_with_mail", "malformed", "dangling", "dangling_refs", "counts"]
        ids: dict[str, Any] = {}
        out: dict[str, Any] = {"scale": self.scale, "seed": self.seed}
        for name in wanted:
            if name in self.TRUTH_KINDS:
                ids[name] = self.truth_ids(name)
            elif name == "deals_with_mail":
                out["deals_with_mail"] = self.deals_with_mail()
            elif name == "malformed":
                detail = self.malformed(badrow_rate)
                out["malformed"] = {k: [r["id"] for r in rows] for k, rows in detail.items()}
                out["malformed_rows"] = detail
            elif name == "dangling":
                out["dangling"] = self.dangling()
            elif name == "dangling_refs":
                out["dangling_refs"] = self.dangling_refs()
            elif name == "counts":
                counts = {k: len(self.truth_ids(k)) if k in ("deals", "deals_archived", "leads", "leads_archived") else self.counts.get(k, 0) for k in self.TRUTH_KINDS}
                counts["mail_messages"] = self.message_total
                counts["deals_with_mail"] = len(self.mail_deal_index)
                out["counts"] = counts
            else:
                raise KeyError(name)
        if ids:
            out["ids"] = ids
        return out
