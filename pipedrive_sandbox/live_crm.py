"""The CRM's further families as the live account serves them now, their two change ops, and their truth.

Mixed into `Live`. Rows come from the generator (crm.py) and are read through the overlay:
* deal products: the generated lines of a deal that exists now, less the lines `product_remove`
  took off (each such change moves the deal's update_time);
* files: `file_replace` gives a file new bytes - a new version, so a new `file_size`, sha256 and
  `update_time`; its id, name and parent stay;
* participants: persons merged since are their survivor, persons deleted since are left out;
* followers: of rows that exist now (a created row: its owner, since its creation);
* deal history: the generated changes, then every live `update` of the deal's `stage_id`,
  `value` or `title` (old and new values as served before and after), newest first.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any

from .clock import parse_time, rfc3339, v1_time
from .crm import USER_AGENT, change_text

LIVE_CHANGE_ID_BASE = 1_000_000_000  # ids of the history entries live updates add (above every generated one)
CRM_TRUTH_KINDS: tuple[str, ...] = ("products", "deal_products", "files", "participants", "followers", "deal_history")
FOLLOWED_KINDS: tuple[str, ...] = ("deals", "persons", "organizations")


class LiveCrm:
    """The CRM overlay of `Live` (module docstring); state is set by `_init_crm`."""

    def _init_crm(self) -> None:
        self.removed_lines: dict[int, set[int]] = {}  # deal index -> line ids removed live
        self.file_versions: dict[int, tuple[int, int]] = {}  # file index -> (version, update ts)
        self.history: dict[int, list[dict[str, Any]]] = {}  # deal index -> changes added live

    # ------------------------------------------------------------------ deal products
    def deal_lines(self, d: int) -> list[dict[str, Any]]:
        """The product lines of deal `d` as served now (generated, less the ones removed live)."""
        lines = self.ds.deal_lines(d)
        gone = self.removed_lines.get(d)
        return [line for line in lines if line["id"] not in gone] if gone else lines

    def _op_product_remove(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        d = self._pick("deals", rng, lambda j: bool(self.deal_lines(j)))
        if d is None:
            return None
        line = rng.choice(self.deal_lines(d))
        self.removed_lines.setdefault(d, set()).add(line["id"])
        self._set("deals", d, ts)
        return {"op": "product_remove", "kind": "deal_products", "id": line["id"], "deal_id": self.ident("deals", d)}

    # ------------------------------------------------------------------ files
    def file_index(self, fid: int) -> int | None:
        """Index of file id `fid` (files are never deleted), or None."""
        return fid - 1 if 1 <= fid <= self.ds.count("files") else None

    def file_version(self, i: int) -> int:
        """The version of file `i` served now (0 = as generated; each `file_replace` adds one)."""
        found = self.file_versions.get(i)
        return found[0] if found else 0

    def file_update_ts(self, i: int) -> int:
        """File `i`'s update_time now in epoch seconds."""
        found = self.file_versions.get(i)
        return found[1] if found else parse_time(self.ds.file_record(i)["update_time"])

    def file_record(self, i: int) -> dict[str, Any]:
        """File `i`'s metadata as served now."""
        found = self.file_versions.get(i)
        return self.ds.file_record(i, found[0], found[1]) if found else self.ds.file_record(i)

    def _op_file_replace(self, kind: str, rng: random.Random, ts: int, seq: int) -> dict[str, Any] | None:
        n = self.ds.count("files")
        candidates = [i for i in (rng.randrange(n) for _ in range(16)) if self.ds.file_access(i) == 200] if n else []
        if not candidates:
            return None
        i = candidates[0]
        version = self.file_version(i) + 1
        self.file_versions[i] = (version, ts)
        return {"op": "file_replace", "kind": "files", "id": i + 1, "version": version}

    def file_sha256(self, i: int) -> str:
        """The sha256 (hex) of file `i`'s bytes as a download serves them now."""
        h = hashlib.sha256()
        for chunk in self.ds.file_chunks(i, self.file_version(i), self.file_record(i)["file_size"]):
            h.update(chunk)
        return h.hexdigest()

    # ------------------------------------------------------------------ participants and followers
    def user_object(self, u: int) -> dict[str, Any]:
        """User `u` as v1 `related_objects` and participants name a user."""
        return {"id": u, "name": " ".join(self.ds.user_name(u)), "email": self.ds.user_email(u), "has_pic": 0, "pic_hash": None, "active_flag": True, "value": u}

    def _person_now(self, p: int) -> int | None:
        """Person index `p` as it is now: itself, or its survivor when merged; None when that one is
        gone (deleted, possibly after the merge)."""
        p = self.merged.get("persons", {}).get(p, p)
        return p if self.exists("persons", p) else None

    def participants(self, d: int) -> list[dict[str, Any]]:
        """The participants of deal `d` as `/v1/deals/{id}/participants` serves them now."""
        ds = self.ds
        deal = self.record("deals", d)
        out: list[dict[str, Any]] = []
        seen: set[int] = set()
        for k, p0 in enumerate(ds.deal_participant_persons(d)):
            p = self._person_now(p0)
            if p is None or p in seen:
                continue
            seen.add(p)
            person = self.record("persons", p)
            owner = person.get("owner_id") if isinstance(person.get("owner_id"), int) else 1
            emails = [dict(e) for e in person.get("emails") or [] if isinstance(e, dict)]
            phones = [dict(e) for e in person.get("phones") or [] if isinstance(e, dict)]
            name = str(person.get("name") or "")
            out.append({
                "id": d * 4 + k + 1,
                "person_id": {"active_flag": True, "name": name, "email": emails, "phone": phones, "owner_id": owner, "value": person.get("id")},
                "add_time": v1_time(ds.add_ts("deals", d) + k * 86400),
                "active_flag": True,
                "related_item_data": {"deal_id": deal["id"], "title": str(deal.get("title") or "")},
                "person": {
                    "id": person.get("id"), "company_id": ds.company()["company_id"], "active_flag": True, "phone": phones, "email": emails,
                    "first_char": name[:1].lower(), "name": name, "first_name": str(person.get("first_name") or ""),
                    "last_name": person.get("last_name"), "owner_name": " ".join(ds.user_name(owner)), "visible_to": str(person.get("visible_to")),
                    "label_ids": [x for x in person.get("label_ids") or [] if isinstance(x, int)],
                },
                "added_by_user_id": self.user_object(ds.deal_owner(d)),
                "related_item_type": "deal",
                "related_item_id": deal["id"],
            })
        return out

    def participant_related(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """`related_objects` of a participants page: the users and persons it names, and their organizations."""
        users: dict[str, Any] = {}
        persons: dict[str, Any] = {}
        orgs: dict[str, Any] = {}
        for row in rows:
            users[str(row["added_by_user_id"]["id"])] = {k: v for k, v in row["added_by_user_id"].items() if k != "value"}
            pid = row["person"]["id"]
            pref = row["person_id"]
            persons[str(pid)] = {"active_flag": True, "id": pid, "name": pref["name"], "email": pref["email"], "phone": pref["phone"], "owner_id": pref["owner_id"]}
            p = self.index_of("persons", pid)
            org_id = self.record("persons", p).get("org_id") if p is not None else None
            o = self.index_of("organizations", org_id) if isinstance(org_id, int) else None
            if o is not None:
                org = self.record("organizations", o)
                orgs[str(org_id)] = {"active_flag": True, "id": org_id, "name": org.get("name"), "people_count": 0, "owner_id": org.get("owner_id"), "address": None, "cc_email": None}
        return {"user": users, "person": persons, "organization": orgs}

    def followers(self, kind: str, index: int) -> list[dict[str, Any]]:
        """The followers of a deal, person or organization as served now: `[{user_id, add_time}]`."""
        ds = self.ds
        if index >= ds.count(kind):  # a row created live: its owner follows it since its creation
            rec = self.record(kind, index)
            return [{"user_id": rec["owner_id"], "add_time": rec["add_time"]}]
        owner = ds.record(kind, index)["owner_id"]
        add = ds.add_ts(kind, index)
        return [{"user_id": u, "add_time": rfc3339(add + k * 86400)} for k, u in enumerate(ds.follower_users(kind, index, owner))]

    # ------------------------------------------------------------------ deal history
    def _note_deal_update(self, d: int, ts: int, seq: int, before: dict[str, Any], values: dict[str, Any]) -> None:
        """Record live update `seq` of deal `d` in its history (the fields whose served value changes)."""
        changes = self.history.setdefault(d, [])
        owner = before.get("owner_id") if isinstance(before.get("owner_id"), int) else 1
        for n, field in enumerate(("stage_id", "value", "title")):
            if field in values and values[field] != before.get(field):
                changes.append({
                    "id": LIVE_CHANGE_ID_BASE + seq * 4 + n,
                    "field_key": field, "old_value": change_text(before.get(field)), "new_value": change_text(values[field]), "ts": ts, "user_id": owner,
                })

    def deal_history(self, d: int) -> list[dict[str, Any]]:
        """Deal `d`'s changes now, newest first, as `/v1/deals/{id}/changelog` serves them (plus `id`)."""
        changes = self.ds.deal_changes(d) + self.history.get(d, [])
        changes = sorted(changes, key=lambda c: (c["ts"], c["id"]), reverse=True)
        return [
            {"id": c["id"], "field_key": c["field_key"], "old_value": c["old_value"], "new_value": c["new_value"], "actor_user_id": c["user_id"],
             "time": v1_time(c["ts"]), "change_source": "app", "change_source_user_agent": USER_AGENT, "is_bulk_update_flag": False}
            for c in changes
        ]

    # ------------------------------------------------------------------ truth
    def crm_truth(self, kind: str) -> dict[str, Any]:
        """`GET /_sandbox/truth?kind=K` for the CRM families (K in CRM_TRUTH_KINDS), the account now:
        * products: `ids.products`, `counts.products`;
        * deal_products: {deal id: [lines as served]} for every deal (active or archived) with lines,
          and `removed_deal_products` (line ids `product_remove` took off);
        * files: [{id, file_name, file_size, sha256, version, download (200 | 403 | 404), deal_id,
          person_id, org_id, activity_id}];
        * participants: {deal id: [{id, person_id}]} for every deal with participants;
        * followers: {deals|persons|organizations: {id: [user ids]}};
        * deal_history: {deal id: [changelog rows, newest first]} for every deal with changes."""
        ds = self.ds
        out: dict[str, Any] = {"scale": ds.scale, "seed": ds.seed}
        if kind == "products":
            ids = [ds.ident("products", i) for i in range(ds.count("products"))]
            out.update(ids={"products": ids}, counts={"products": len(ids)})
        elif kind == "deal_products":
            out["deal_products"] = {str(self.ident("deals", d)): lines for d in self.universe("deals") if (lines := self.deal_lines(d))}
            out["removed_deal_products"] = sorted(x for v in self.removed_lines.values() for x in v)
        elif kind == "files":
            rows = []
            for i in range(ds.count("files")):
                rec = self.file_record(i)
                rows.append({
                    "id": rec["id"], "file_name": rec["file_name"], "file_size": rec["file_size"], "sha256": self.file_sha256(i),
                    "version": self.file_version(i), "download": ds.file_access(i),
                    **{k: rec[k] for k in ("deal_id", "person_id", "org_id", "activity_id")},
                })
            out["files"] = rows
        elif kind == "participants":
            out["participants"] = {
                str(self.ident("deals", d)): [{"id": r["id"], "person_id": r["person"]["id"]} for r in rows]
                for d in self.universe("deals") if (rows := self.participants(d))
            }
        elif kind == "followers":
            out["followers"] = {k: {str(self.ident(k, i)): [f["user_id"] for f in self.followers(k, i)] for i in self.universe(k)} for k in FOLLOWED_KINDS}
        elif kind == "deal_history":
            out["deal_history"] = {str(self.ident("deals", d)): rows for d in self.universe("deals") if (rows := self.deal_history(d))}
        else:
            raise KeyError(kind)
        return out
