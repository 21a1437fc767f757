"""The changes a live account applies, one op at a time, each drawn from (seed, seq).

Ops (kinds; what a consumer sees):
* create (organizations, persons, deals, leads, activities, notes): a row at the next index of its
  kind - an id above all (gapped kinds skip the purged multiples of 21), a new uuid for leads -
  built by the generator; add_time = update_time = the change's time; references to purged,
  deleted or merged parents are re-pointed to the survivor or set to null.
* update (same kinds): visible fields change (organizations name; persons name, first_name,
  last_name; deals value, stage_id, stage_change_time, sometimes title; leads title, value;
  activities subject, note; notes content) and update_time moves.
* delete (same kinds; deals only those without mail): gone from every list, 404 on GET; children
  keep the reference (listed in truth `deleted_refs`).
* archive / unarchive (deals, leads): moves between the active and the archived lists;
  `is_archived` (deals also `archive_time`) and update_time change.
* merge (persons, organizations): the merged id answers 404 and leaves the lists; every row that
  referenced it (persons' org_id, deals, leads, activities incl. participants, notes incl. their
  embedded name) is re-pointed to the survivor with its update_time moved; the survivor's
  update_time moves.
* mail (deals): a new message (id above all, above the hostile_mail ids) listed under the deal's
  mailMessages with a fetchable body; the deal's update_time moves, its email_messages_count grows.
* product_remove (deal products): one line leaves its deal's products; the deal's update_time moves.
* file_replace (files): a file gets new bytes (a new version: file_size, sha256, update_time).
* convert (leads; Pipedrive's lead conversion): an active lead that activities or notes are attached
  to becomes a new deal (created as by `create`, with the lead's title, person and organization);
  the lead is gone (404, off the lists, truth `deleted` and `converted`) and its activities and
  notes move to the deal - `deal_id` set, `lead_id` null, update_time moved.
* unlink (deals): a deal's person is removed - `person_id` null, update_time moved.
* rename_field / relabel_option / delete_field (the deal custom fields, which leads share): a field
  gets a new name, an enum or set option a new label, or a field is deleted - gone from the field
  lists and from every record's values. No record's update_time moves (truth `field_changes`).
The last seven weigh 0 in the default mix (product_remove and file_replace live in live_crm.py),
so the changes a seed draws under it do not depend on them.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Sequence

from .clock import day, iso_ms, rfc3339
from .config import parse_live_mix
from .hashing import mix
from .kinds import REF_FIELDS
from .shapes import _time_text
from .vocab import CURRENCIES, FIRST_NAMES, LAST_NAMES, ORG_SUFFIX, ORG_WORDS_A, ORG_WORDS_B, PRODUCTS

LIVE_KINDS: tuple[str, ...] = ("organizations", "persons", "deals", "leads", "activities", "notes")

# (kind, weight) per op: which kinds an op touches and how often.
OP_KINDS: dict[str, tuple[tuple[str, float], ...]] = {
    "create": (("persons", 3), ("organizations", 1), ("deals", 2), ("leads", 1), ("activities", 3), ("notes", 3)),
    "update": (("persons", 3), ("organizations", 1), ("deals", 3), ("leads", 1), ("activities", 2), ("notes", 2)),
    "delete": (("persons", 2), ("organizations", 1), ("deals", 1), ("leads", 1), ("activities", 2), ("notes", 2)),
    "archive": (("deals", 2), ("leads", 1)),
    "unarchive": (("deals", 2), ("leads", 1)),
    "merge": (("persons", 2), ("organizations", 1)),
    "mail": (("deals", 1),),
    "product_remove": (("deal_products", 1),),
    "file_replace": (("files", 1),),
    "convert": (("leads", 1),),
    "unlink": (("deals", 1),),
    "rename_field": (("fields", 1),),
    "relabel_option": (("fields", 1),),
    "delete_field": (("fields", 1),),
}
TIMED_FIELDS = ("add_time", "update_time")
S_LIVE = 60  # hash stream of the live changes, independent of the data's and the shapes' streams


def _weighted(rng: random.Random, pairs: Sequence[tuple[str, float]]) -> str:
    total = sum(w for _, w in pairs)
    x = rng.random() * total
    for name, w in pairs:
        if w <= 0:
            continue
        x -= w
        if x < 0:
            return name
    return next(name for name, w in reversed(pairs) if w > 0)


class Changes:
    """The change ops of `Live` (mixed into it): each reads and writes the overlay `Live` keeps."""

    def _tick(self) -> int:
        flips = [t for f in self.shapes.flipped.values() for t in f.values()]
        last = max([self.last_ts, *flips])
        ts = max(int(time.time()), last + 1)
        self.last_ts = ts
        return ts

    def _apply_one(self) -> dict[str, Any]:
        seq = self.applied + 1
        rng = random.Random(mix(self.ds.seed, S_LIVE, seq))
        weights = parse_live_mix(self._config().live_mix)
        ts = self._tick()
        change: dict[str, Any] | None = None
        for _ in range(12):
            op = _weighted(rng, weights)
            kind = _weighted(rng, OP_KINDS[op])
            change = getattr(self, f"_op_{op}")(kind, rng, ts, seq)
            if change is not None:
                break
        if change is None:  # nothing else possible (e.g. every row deleted): a create always is
            change = self._op_create("persons", rng, ts, seq)
        assert change is not None
        self.applied = seq
        self.version += 1
        out = {"seq": seq, "at": rfc3339(ts), **change}
        self.log.append(out)
        return dict(out)

    def _pick(self, kind: str, rng: random.Random, ok: Callable[[int], bool] | None = None) -> int | None:
        """A row of `kind` that exists now and passes ok(index), drawn deterministically."""
        n = self.size(kind)
        if n == 0:
            return None
        gone = self.gone[kind]
        for _ in range(64):
            i = rng.randrange(n)
            if i not in gone and (ok is None or ok(i)):
                return i
        candidates = [i for i in range(n) if i not in gone and (ok is None or ok(i))]
        return rng.choice(candidates) if candidates else None

    def _set(self, kind: str, index: int, ts: int | None = None, **values: Any) -> None:
        if values:
            self.fields[kind].setdefault(index, {}).update(values)
        if ts is not None:
            self.ts[kind][index] = ts

    def _resolve(self, parent: str, value: Any) -> Any:
        """A reference as a created row may hold it: the parent's id when it exists now, the
        survivor's when it was merged, else None (purged or deleted)."""
        if value is None:
            return None
        i = self.cursor_index(parent, value) if parent in LIVE_KINDS else None
        if i is None or (parent not in LIVE_KINDS):
            return None
        merged = self.merged.get(parent, {})
        if i in merged:
            return self.ident(parent, merged[i])
        return None if i in self.gone[parent] else value

    # -- reverse references (built on first need, kept current after that)
    def _ref_index(self) -> dict[tuple[str, Any], set[tuple[str, int, str]]]:
        """{(parent kind, parent id): {(child kind, child index, field)}} of the references now.
        Built once (call under the lock): the generated part (one `Dataset.refs` per row: ~1 s per
        40,000 rows, so seconds on seed-customer) - by the prebuild thread when the background
        started one - then the rows live changes touched."""
        if self._refs is None:
            thread = self._prebuild_thread
            if thread is not None:
                thread.join()
            refs = self._prebuilt if self._prebuilt is not None else self._generated_refs()
            self._prebuilt = None
            size = self.ds.count
            for child, pairs in REF_FIELDS.items():
                kind_of = dict(pairs)
                for ci in self.touched(child):
                    if ci < size(child):
                        for field, value in self.ds.refs(child, ci).items():
                            if value is not None:
                                refs.get((kind_of[field], value), set()).discard((child, ci, field))
                    for field, value in self._refs_now(child, ci).items():
                        if value is not None:
                            refs.setdefault((kind_of[field], value), set()).add((child, ci, field))
            self._refs = refs
        return self._refs

    def _generated_refs(self) -> dict[tuple[str, Any], set[tuple[str, int, str]]]:
        """The reverse references of the generated rows (reads only the pure Dataset: no lock)."""
        refs: dict[tuple[str, Any], set[tuple[str, int, str]]] = {}
        for child, pairs in REF_FIELDS.items():
            kind_of = dict(pairs)
            for ci in range(self.ds.count(child)):
                for field, value in self.ds.refs(child, ci).items():
                    if value is not None:
                        refs.setdefault((kind_of[field], value), set()).add((child, ci, field))
        return refs

    def _prebuild(self) -> None:
        self._prebuilt = self._generated_refs()

    def prebuild_refs(self) -> None:
        """Start building the generated part of the reference index in a thread (idempotent), so
        the first merge of a background run does not stall the server on a large scale."""
        if self._refs is None and self._prebuild_thread is None:
            self._prebuild_thread = threading.Thread(target=self._prebuild, name="pipedrive-sandbox-live-refs", daemon=True)
            self._prebuild_thread.start()

    def _refs_now(self, kind: str, index: int) -> dict[str, Any]:
        """The row's reference fields now (cheap: no row is built); {} for kinds without any."""
        if kind not in REF_FIELDS:
            return {}
        refs = self.ds.refs(kind, index)
        own = self.fields[kind].get(index)
        return {f: own.get(f, v) for f, v in refs.items()} if own else refs

    def _plain(self, kind: str, index: int) -> dict[str, Any]:
        """The row's current values without malformation or shapes (references, names)."""
        rec = self.ds.record(kind, index, 0.0)
        own = self.fields[kind].get(index)
        return {**rec, **own} if own else rec

    def _note_embeds(self, rec: dict[str, Any]) -> dict[str, Any]:
        """The names a note embeds for its deal, organization and person, from its references now."""
        out: dict[str, Any] = {}
        for field, parent, key, name in (("deal_id", "deals", "deal", "title"), ("org_id", "organizations", "organization", "name"), ("person_id", "persons", "person", "name")):
            i = self.index_of(parent, rec.get(field)) if rec.get(field) is not None else None
            out[key] = {name: self._plain(parent, i).get(name)} if i is not None else None
        return out

    # -- ops; each returns the change's fields (op, kind, id, ...) or None when it cannot apply
    def _op_create(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        index = self.size(kind)
        rec = self.ds.record(kind, index, 0.0)
        text = _time_text(kind, ts)
        values: dict[str, Any] = {"add_time": text}
        for field, parent in REF_FIELDS.get(kind, ()):
            resolved = self._resolve(parent, rec.get(field))
            if resolved != rec.get(field):
                values[field] = resolved
        if kind == "deals":
            values.update(
                status="open", close_time=None, won_time=None, lost_time=None, lost_reason=None,
                stage_change_time=rfc3339(ts), is_archived=False, archive_time=None,
            )
        elif kind == "activities":
            person = values.get("person_id", rec.get("person_id"))
            values.update(
                due_date=day(ts + 7 * 86400), done=False, marked_as_done_time=None,
                participants=[{"person_id": person, "primary": True}] if person is not None else [],
            )
        elif kind == "leads":
            values.update(is_archived=False)
            self.lead_ids[rec["id"]] = index
        self.extra[kind] += 1
        self._set(kind, index, ts, **values)
        if kind == "notes":
            self._set(kind, index, None, **self._note_embeds(self._plain(kind, index)))
        if self._refs is not None:
            now = self._refs_now(kind, index)
            for field, parent in REF_FIELDS.get(kind, ()):
                if now.get(field) is not None:
                    self._refs.setdefault((parent, now[field]), set()).add((kind, index, field))
        return {"op": "create", "kind": kind, "id": self.ident(kind, index)}

    def _op_update(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        i = self._pick(kind, rng)
        if i is None:
            return None
        now = self._plain(kind, i)
        values: dict[str, Any] = {}
        if kind == "organizations":
            suffix = rng.choice(ORG_SUFFIX)
            values["name"] = f"{rng.choice(ORG_WORDS_A)} {rng.choice(ORG_WORDS_B)} {suffix}".strip() + f" ({seq})"
        elif kind == "persons":
            first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
            values.update(name=f"{first} {last}", first_name=first, last_name=last)
        elif kind == "deals":
            value = float(rng.randrange(1, 400) * 250)
            if value == now.get("value"):
                value += 250.0
            per = self.ds.spec.stages_per_pipeline
            pipeline = int(now.get("pipeline_id") or 1) - 1
            stage = pipeline * per + rng.randrange(per) + 1
            values.update(value=value, stage_id=stage, stage_change_time=rfc3339(ts))
            if rng.random() < 0.35:
                base = str(now.get("title") or "").rsplit(" - ", 1)[0]
                values["title"] = f"{base} - {rng.choice(PRODUCTS)} ({seq})"
        elif kind == "leads":
            values["title"] = f"{rng.choice(ORG_WORDS_A)} {rng.choice(PRODUCTS).lower()} lead ({seq})"
            old = now.get("value")
            currency = old.get("currency") if isinstance(old, dict) else rng.choice(CURRENCIES)
            values["value"] = {"amount": float(rng.randrange(1, 100) * 100 + seq % 100), "currency": currency}
        elif kind == "activities":
            atype = str(now.get("type") or "task")
            values.update(
                subject=f"{atype.capitalize()}: {rng.choice(PRODUCTS)} ({seq})",
                note=f"<p>{rng.choice(('Moved', 'Rescheduled', 'Agenda changed', 'Prepared'))} (change {seq})</p>",
            )
        elif kind == "notes":
            values["content"] = (
                f"<p>{rng.choice(('Called again', 'Emailed', 'Met', 'Reviewed'))} about {rng.choice(PRODUCTS).lower()};"
                f" next step: {rng.choice(('quote', 'demo', 'contract', 'wait'))} (change {seq}).</p>"
            )
        if kind == "deals":
            self._note_deal_update(i, ts, seq, now, values)
        self._set(kind, i, ts, **values)
        return {"op": "update", "kind": kind, "id": self.ident(kind, i), "fields": sorted(values)}

    def _op_delete(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        ok = (lambda d: not self.deal_message_ids(d)) if kind == "deals" else None  # mail stays on its deal
        i = self._pick(kind, rng, ok)
        if i is None:
            return None
        self.gone[kind].add(i)
        self.deleted[kind].append(i)
        return {"op": "delete", "kind": kind, "id": self.ident(kind, i)}

    def _op_archive(self, kind: str, rng: random.Random, ts: int, seq: int, archive: bool = True) -> dict[str, Any] | None:
        i = self._pick(kind, rng, lambda j: self.is_archived(kind, j) != archive)
        if i is None:
            return None
        self.archived[kind][i] = archive
        values: dict[str, Any] = {"is_archived": archive}
        if kind == "deals":
            values["archive_time"] = rfc3339(ts) if archive else None
        self._set(kind, i, ts, **values)
        return {"op": "archive" if archive else "unarchive", "kind": kind, "id": self.ident(kind, i)}

    def _op_unarchive(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        return self._op_archive(kind, rng, ts, seq, archive=False)

    def _op_merge(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        old = self._pick(kind, rng)
        if old is None:
            return None
        survivor = self._pick(kind, rng, lambda j: j != old)
        if survivor is None:
            return None
        old_id, new_id = self.ident(kind, old), self.ident(kind, survivor)
        refs = self._ref_index()
        children = sorted(refs.pop((kind, old_id), set()))
        repointed: dict[str, list[Any]] = {}
        for child, ci, field in children:
            refs.setdefault((kind, new_id), set()).add((child, ci, field))
            if not self.exists(child, ci):
                continue  # a gone row keeps what it had
            values: dict[str, Any] = {field: new_id}
            if child == "activities" and field == "person_id":
                parts = self._plain(child, ci).get("participants") or []
                values["participants"] = [{**p, "person_id": new_id} if p.get("person_id") == old_id else p for p in parts]
            self._set(child, ci, ts, **values)
            if child == "notes":
                self._set(child, ci, None, **self._note_embeds(self._plain(child, ci)))
            ids = repointed.setdefault(child, [])
            if self.ident(child, ci) not in ids:
                ids.append(self.ident(child, ci))
        self.gone[kind].add(old)
        merged = self.merged[kind]
        for k, v in list(merged.items()):
            if v == old:
                merged[k] = survivor
        merged[old] = survivor
        self._set(kind, survivor, ts)
        return {"op": "merge", "kind": kind, "id": old_id, "into": new_id, "repointed": repointed}

    def _op_mail(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        d = self._pick("deals", rng)
        if d is None:
            return None
        mid = self.first_mail_id + len(self.mail)
        data, body = self._new_message(mid, d, ts, rng)
        self.mail[mid] = (d, data, body)
        self.mail_by_deal.setdefault(d, []).append(mid)
        self._set("deals", d, ts)
        return {"op": "mail", "kind": "mail_messages", "id": mid, "deal_id": self.ident("deals", d)}

    def _new_deal(self, ts: int, **values: Any) -> int:
        """A deal created now (as `create` makes one), with these values on top; its index."""
        index = self.size("deals")
        rec = self.ds.record("deals", index, 0.0)
        own: dict[str, Any] = {"add_time": _time_text("deals", ts)}
        for field, parent in REF_FIELDS["deals"]:
            resolved = self._resolve(parent, rec.get(field))
            if resolved != rec.get(field):
                own[field] = resolved
        own.update(status="open", close_time=None, won_time=None, lost_time=None, lost_reason=None,
                   stage_change_time=rfc3339(ts), is_archived=False, archive_time=None, **values)
        self.extra["deals"] += 1
        self._set("deals", index, ts, **own)
        if self._refs is not None:
            for field, parent in REF_FIELDS["deals"]:
                now = self._refs_now("deals", index).get(field)
                if now is not None:
                    self._refs.setdefault((parent, now), set()).add(("deals", index, field))
        return index

    def _op_convert(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        refs = self._ref_index()

        def attached(j: int, kinds: tuple[str, ...] = ("activities", "notes")) -> bool:
            children = {c for c, ci, f in refs.get(("leads", self.ident("leads", j)), ()) if f == "lead_id" and self.exists(c, ci)}
            return not self.is_archived("leads", j) and all(k in children for k in kinds)

        # a lead with both activities and notes when there is one: the conversion moves both
        i = self._pick("leads", rng, attached)
        if i is None:
            i = self._pick("leads", rng, lambda j: attached(j, ("activities",)) or attached(j, ("notes",)))
        if i is None:
            return None
        lead, lead_id = self._plain("leads", i), self.ident("leads", i)
        value = lead.get("value") if isinstance(lead.get("value"), dict) else {}
        # A lead without a value becomes a deal worth 0 in the deal's usual currency: a deal's value
        # is a number in Pipedrive's deal schema (the summary adds them up), never null.
        money: dict[str, Any] = {"value": value.get("amount") or 0}
        if value.get("currency"):
            money["currency"] = value["currency"]
        d = self._new_deal(ts, title=lead.get("title"), person_id=self._resolve("persons", lead.get("person_id")),
                           org_id=self._resolve("organizations", lead.get("organization_id")), **money)
        deal_id = self.ident("deals", d)
        moved: dict[str, list[Any]] = {}
        for child, ci, field in sorted(refs.pop(("leads", lead_id), set())):
            if field != "lead_id" or not self.exists(child, ci):
                continue
            old_deal = self._refs_now(child, ci).get("deal_id")
            if old_deal is not None:
                refs.get(("deals", old_deal), set()).discard((child, ci, "deal_id"))
            refs.setdefault(("deals", deal_id), set()).add((child, ci, "deal_id"))
            self._set(child, ci, ts, lead_id=None, deal_id=deal_id)
            if child == "notes":
                self._set(child, ci, None, **self._note_embeds(self._plain(child, ci)))
            moved.setdefault(child, []).append(self.ident(child, ci))
        self.gone["leads"].add(i)
        self.deleted["leads"].append(i)
        self.converted[i] = d
        return {"op": "convert", "kind": "leads", "id": lead_id, "deal_id": deal_id, "moved": moved}

    def _op_unlink(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        i = self._pick("deals", rng, lambda j: self._refs_now("deals", j).get("person_id") is not None)
        if i is None:
            return None
        person = self._refs_now("deals", i)["person_id"]
        if self._refs is not None:
            self._refs.get(("persons", person), set()).discard(("deals", i, "person_id"))
        self._set("deals", i, ts, person_id=None)
        return {"op": "unlink", "kind": "deals", "id": self.ident("deals", i), "fields": ["person_id"], "person_id": person}

    def _live_fields(self, ok: Callable[[Any], bool] = lambda f: True) -> list[Any]:
        gone = set(self.fields_deleted)
        return [f for f in self.ds.custom_fields["deal"] if f.key not in gone and ok(f)]

    def _op_rename_field(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        fields = self._live_fields()
        if not fields:
            return None
        f = rng.choice(fields)
        name = f"{self.field_names.get(f.key, f.name)} (renamed {seq})"
        self.field_names[f.key] = name
        return {"op": "rename_field", "kind": "fields", "id": f.key, "entity": f.entity, "name": name}

    def _op_relabel_option(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        fields = self._live_fields(lambda f: bool(f.options))
        if not fields:
            return None
        f = rng.choice(fields)
        option, label = rng.choice(f.options)
        labels = self.option_labels.setdefault(f.key, {})
        labels[option] = f"{labels.get(option, label)} (relabelled {seq})"
        return {"op": "relabel_option", "kind": "fields", "id": f.key, "entity": f.entity, "option": option,
                "label": labels[option]}

    def _op_delete_field(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        if len(self._live_fields()) < 2:  # a deal keeps at least one custom field
            return None
        # a field no other change touched when there is one: each change stays visible on its own
        fields = self._live_fields(lambda f: f.key not in self.field_names and f.key not in self.option_labels)
        f = rng.choice(fields or self._live_fields())
        self.fields_deleted.append(f.key)
        self.version += 1
        return {"op": "delete_field", "kind": "fields", "id": f.key, "entity": f.entity}

    def _new_message(self, mid: int, d: int, ts: int, rng: random.Random) -> tuple[dict[str, Any], str]:
        ds = self.ds
        deal = self._plain("deals", d)
        owner = deal.get("owner_id") if isinstance(deal.get("owner_id"), int) else 1
        user_name = " ".join(ds.user_name(owner))

        def party(pid: int, email: str, name: str, person_id: Any) -> dict[str, Any]:
            return {"id": pid, "email_address": email, "name": name, "linked_person_id": person_id,
                    "linked_person_name": name if person_id is not None else None, "mail_message_party_id": pid}

        user = party(2 * mid, ds.user_email(owner), user_name, None)
        p = self.index_of("persons", deal.get("person_id")) if deal.get("person_id") is not None else None
        emails = [e.get("value") for e in (self._plain("persons", p).get("emails") or [])] if p is not None else []
        if p is not None and emails:
            person = self._plain("persons", p)
            contact = party(2 * mid + 1, emails[0], person.get("name") or "", self.ident("persons", p))
        else:
            contact = party(2 * mid + 1, f"info{mid % 97}@{ds.company_domain}", "", None)
        inbound = rng.random() < 0.55
        sender, receiver = (contact, user) if inbound else (user, contact)
        subject = "Re: " + str(deal.get("title") or "")
        company = ds.company_domain.split(".")[0]
        t = iso_ms(ts)
        data = {
            "id": mid,
            "from": [sender],
            "to": [receiver],
            "cc": [],
            "bcc": [],
            "body_url": f"https://{company}.pipedrive.example/v1/mailbox/mailMessages/{mid}/body",
            "account_id": f"acct{owner:06d}",
            "user_id": owner,
            "mail_thread_id": 1_000_000 + self.ident("deals", d) * 4 + 3,
            "subject": subject,
            "snippet": f"Hello, following up on {subject[:60]}",
            "mail_tracking_status": rng.choice(("opened", "not opened", None)),
            "mail_link_tracking_enabled_flag": 0,
            "read_flag": 0,
            "draft": "",
            "draft_flag": 0,
            "synced_flag": 1,
            "deleted_flag": 0,
            "has_body_flag": 1,
            "sent_flag": 0 if inbound else 1,
            "sent_from_pipedrive_flag": 0 if inbound else 1,
            "smart_bcc_flag": 0,
            "message_time": t,
            "add_time": t,
            "update_time": t,
            "has_attachments_flag": 0,
            "has_inline_attachments_flag": 0,
            "has_real_attachments_flag": 0,
            "nylas_id": f"{mix(ds.seed, mid):016x}",
            "s3_bucket": "pipedrive-mail-sandbox",
            "s3_bucket_path": f"sandbox/{owner}/nylas/{mid}/body",
            "external_deleted_flag": False,
            "mua_message_id": f"{mix(ds.seed, mid, 2):016x}@mailer.example",
            "item_type": "mailMessage",
            "timestamp": t,
            "company_id": ds.company()["company_id"],
        }
        body = "\n".join([
            f"<p>{rng.choice(('Hi', 'Hello', 'Dear team'))},</p>",
            f"<p>Regarding {deal.get('title')}: {rng.choice(('the new quote is attached', 'can we meet this week', 'thanks for today', 'the contract is signed'))}.</p>",
            f"<p>Message {mid}, written while the migration ran.</p>",
            "<p>Best regards</p>",
        ])
        return data, body
