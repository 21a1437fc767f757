"""Rows as the API serves them, built from (seed, kind, index): one builder per kind, and malformed copies."""
from __future__ import annotations

import random
from typing import Any

from .clock import T0, T_END, day, iso_ms, rfc3339, v1_time
from .hashing import S_DANGLE, S_RECORD, S_UUID, make_uuid, mix
from .kinds import KIND_CODE, id_to_index, index_to_id
from .vocab import (
    ACTIVITY_TYPES,
    BODY_WORDS,
    CITIES,
    CURRENCIES,
    FREEMAIL,
    HOSTILE_UNICODE,
    HTML_INJECTION,
    LAST_NAMES,
    LEAD_SOURCES,
    LOST_REASONS,
    PRODUCTS,
    SQL_INJECTION,
)

MALFORMED_VARIANTS: tuple[str, ...] = (
    "missing_id",
    "id_string",
    "name_dict",
    "oversize",
    "nul_bytes",
    "sql_injection",
    "html_injection",
    "hostile_unicode",
    "wrong_types",
)
NAME_FIELD = {
    "organizations": "name",
    "persons": "name",
    "deals": "title",
    "leads": "title",
    "activities": "subject",
    "notes": "content",
    "mail_messages": "subject",
}


class Records:
    """The row builders of `Dataset` (mixed into it): each reads the dataset's indexes and facts."""

    def record(self, kind: str, index: int, badrow_rate: float = 0.0) -> dict[str, Any]:
        """The API-shaped record of `kind` at `index` (shared: copy before mutating)."""
        return self._record_cache(kind, index, badrow_rate)

    def _build_record(self, kind: str, index: int, badrow_rate: float) -> dict[str, Any]:
        builder = getattr(self, f"_build_{kind}")
        rec = builder(index)
        if self.is_malformed(kind, index, badrow_rate):
            rec = self._malform(kind, index, rec)
        return rec

    # References (REF_FIELDS) without building the row: the builders draw them the same way, first.
    def refs(self, kind: str, index: int) -> dict[str, Any]:
        """The reference fields of a row as the generator serves them ({field: id or None}, the
        fields of REF_FIELDS[kind]); a few microseconds, where building the row costs far more."""
        if kind == "persons":
            return self._person_refs(index)
        rng = self._rng(S_RECORD, KIND_CODE[kind], index)
        if kind == "deals":
            return self._deal_refs(index, rng)
        if kind == "leads":
            return self._lead_refs(index, rng)
        if kind in ("activities", "notes"):
            return self._target(kind, index, rng)
        raise KeyError(kind)

    def _person_refs(self, i: int) -> dict[str, Any]:
        org = self.person_org(i)
        org_id = index_to_id("organizations", org) if org is not None else None
        if self.is_dangling("persons", i):
            org_id = self.dangling_ref("persons", i, "organizations")
        return {"org_id": org_id}

    def _deal_refs(self, i: int, rng: random.Random) -> dict[str, Any]:
        """(Draws from the deal's record rng exactly as its builder does, before anything else.)"""
        person = self.deal_person(i)
        org = self.deal_org(i)
        person_id = index_to_id("persons", person) if person is not None else None
        org_id = index_to_id("organizations", org) if org is not None else None
        if self.is_dangling("deals", i):
            if person_id is not None and (org_id is None or rng.random() < 0.5):
                person_id = self.dangling_ref("deals", i, "persons")
            else:
                org_id = self.dangling_ref("deals", i, "organizations")
        return {"person_id": person_id, "org_id": org_id}

    def _lead_refs(self, i: int, rng: random.Random) -> dict[str, Any]:
        """(Draws from the lead's record rng exactly as its builder does, before anything else.)"""
        person = rng.randrange(self.counts["persons"]) if rng.random() < 0.8 else None
        org = self.person_org(person) if person is not None else None
        if person is None or (org is None and rng.random() < 0.3):
            org = rng.randrange(self.counts["organizations"])
        person_id = index_to_id("persons", person) if person is not None else None
        org_id = index_to_id("organizations", org) if org is not None else None
        if self.is_dangling("leads", i):
            if person_id is not None:
                person_id = self.dangling_ref("leads", i, "persons")
            else:
                org_id = self.dangling_ref("leads", i, "organizations")
        return {"person_id": person_id, "organization_id": org_id}

    def _build_users(self, i: int) -> dict[str, Any]:
        rng = self._rng(S_RECORD, KIND_CODE["users"], i)
        uid = i + 1
        first, last = self.user_name(uid)
        created = T0 - 86400 * 30 + i * 86400 * 3
        active = i == 0 or rng.random() > 0.1
        return {
            "id": uid,
            "name": f"{first} {last}",
            "default_currency": "EUR",
            "locale": "en_US",
            "lang": 1,
            "email": self.user_email(uid),
            "phone": f"+372 5{rng.randrange(1000000, 9999999)}" if rng.random() < 0.7 else None,
            "activated": True,
            "last_login": v1_time(T_END - rng.randrange(0, 90 * 86400)),
            "created": v1_time(created),
            "modified": v1_time(created + rng.randrange(86400, 300 * 86400)),
            "has_created_company": i == 0,
            "access": [
                {"app": "sales", "admin": i == 0, "permission_set_id": make_uuid(self._h(S_UUID, 1, 1), self._h(S_UUID, 1, 2 + (i == 0)))},
                {"app": "global", "admin": i == 0, "permission_set_id": make_uuid(self._h(S_UUID, 2, 1), self._h(S_UUID, 2, 2 + (i == 0)))},
            ],
            "active_flag": active,
            "timezone_name": "Europe/Tallinn",
            "timezone_offset": "+03:00",
            "role_id": 1,
            "icon_url": None,
            "is_you": i == 0,
            "is_deleted": False,
        }

    def _address(self, rng: random.Random) -> dict[str, Any]:
        city, country = rng.choice(CITIES)
        number = str(rng.randrange(1, 200))
        street = f"{rng.choice(LAST_NAMES)} {rng.choice(('Street', 'tee', 'straße', 'Road'))}"
        postal = str(rng.randrange(10000, 99999))
        return {
            "value": f"{street} {number}, {postal} {city}, {country}",
            "country": country,
            "admin_area_level_1": city,
            "admin_area_level_2": None,
            "locality": city,
            "sublocality": None,
            "route": street,
            "street_number": number,
            "subpremise": None,
            "postal_code": postal,
        }

    def _build_organizations(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["organizations"]
        rng = self._rng(S_RECORD, code, i)
        return {
            "id": index_to_id("organizations", i),
            "name": self.org_name(i),
            "owner_id": 1 + rng.randrange(self.counts["users"]),
            "add_time": rfc3339(self.add_ts("organizations", i)),
            "update_time": rfc3339(self.update_ts("organizations", i)),
            "is_deleted": False,
            "visible_to": rng.choice((3, 3, 7)),
            "address": self._address(rng) if rng.random() < 0.7 else None,
            "label_ids": [rng.randrange(1, 5)] if rng.random() < 0.2 else [],
            "custom_fields": self.custom_values("organization", "organizations", i),
        }

    def _build_persons(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["persons"]
        rng = self._rng(S_RECORD, code, i)
        first, last = self.person_name(i)
        org_id = self._person_refs(i)["org_id"]
        emails = self.person_emails(i)
        labels = ("work", "home", "other")
        return {
            "id": index_to_id("persons", i),
            "name": f"{first} {last}",
            "first_name": first,
            "last_name": last,
            "owner_id": self.person_owner(i),
            "org_id": org_id,
            "add_time": rfc3339(self.add_ts("persons", i)),
            "update_time": rfc3339(self.update_ts("persons", i)),
            "emails": [{"value": e, "primary": n == 0, "label": labels[min(n, 2)]} for n, e in enumerate(emails)],
            "phones": (
                [{"value": f"+{rng.choice((372, 49, 46, 44))} {rng.randrange(1000000, 99999999)}", "primary": True, "label": "work"}]
                if rng.random() < 0.7
                else []
            ),
            "is_deleted": False,
            "visible_to": rng.choice((3, 3, 7)),
            "label_ids": [rng.randrange(1, 5)] if rng.random() < 0.15 else [],
            "picture_id": None,
            "postal_address": self._address(rng) if rng.random() < 0.3 else None,
            "notes": None,
            "im": [],
            "birthday": None,
            "job_title": rng.choice(("CEO", "CTO", "Buyer", "Head of Sales", "Engineer", "Office manager", None)),
            "custom_fields": self.custom_values("person", "persons", i),
        }

    def _build_deals(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["deals"]
        rng = self._rng(S_RECORD, code, i)
        refs = self._deal_refs(i, rng)
        person_id, org_id = refs["person_id"], refs["org_id"]
        archived = self.is_archived("deals", i)
        n_pipe = self.counts["pipelines"]
        pipeline = 0 if rng.random() < 0.6 else rng.randrange(n_pipe)
        stage = pipeline * self.spec.stages_per_pipeline + rng.randrange(self.spec.stages_per_pipeline)
        add = self.add_ts("deals", i)
        upd = self.update_ts("deals", i)
        status = rng.choices(("open", "won", "lost"), (0.5, 0.3, 0.2))[0]
        if archived and status == "open" and rng.random() < 0.7:
            status = rng.choice(("won", "lost"))
        close = add + (upd - add) // 2 if status != "open" else None
        rec = {
            "id": index_to_id("deals", i),
            "title": self.deal_title(i),
            "creator_user_id": self.deal_owner(i),
            "owner_id": self.deal_owner(i),
            "person_id": person_id,
            "org_id": org_id,
            "pipeline_id": pipeline + 1,
            "stage_id": stage + 1,
            "value": float(rng.randrange(0, 200) * 250),
            "currency": rng.choice(CURRENCIES),
            "add_time": rfc3339(add),
            "update_time": rfc3339(upd),
            "stage_change_time": rfc3339(add + (upd - add) // 3),
            "is_deleted": False,
            "is_archived": archived,
            "archive_time": rfc3339(upd) if archived else None,
            "status": status,
            "probability": None,
            "lost_reason": rng.choice(LOST_REASONS) if status == "lost" else None,
            "visible_to": rng.choice((3, 3, 7)),
            "close_time": rfc3339(close) if close else None,
            "won_time": rfc3339(close) if status == "won" and close else None,
            "lost_time": rfc3339(close) if status == "lost" and close else None,
            "expected_close_date": day(add + rng.randrange(14, 180) * 86400) if rng.random() < 0.7 else None,
            "label_ids": [rng.randrange(1, 5)] if rng.random() < 0.2 else [],
            "origin": rng.choice(("ManuallyCreated", "ManuallyCreated", "Import", "API")),
            "origin_id": None,
            "channel": None,
            "channel_id": None,
            "source_lead_id": None,
            "arr": None,
            "mrr": None,
            "acv": None,
            "custom_fields": self.custom_values("deal", "deals", i),
        }
        return rec

    def _build_leads(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["leads"]
        rng = self._rng(S_RECORD, code, i)
        refs = self._lead_refs(i, rng)
        person_id, org_id = refs["person_id"], refs["organization_id"]
        owner = 1 + rng.randrange(self.counts["users"])
        add = self.add_ts("leads", i)
        rec: dict[str, Any] = {
            "id": self.lead_uuid(i),
            "title": self.lead_title(i),
            "owner_id": owner,
            "creator_id": owner,
            "label_ids": [make_uuid(self._h(S_UUID, 9, k), self._h(S_UUID, 10, k)) for k in range(rng.randrange(0, 2))],
            "person_id": person_id,
            "organization_id": org_id,
            "source_name": rng.choice(LEAD_SOURCES),
            "origin": "ManuallyCreated",
            "origin_id": None,
            "channel": None,
            "channel_id": None,
            "source_deal_id": None,
            "is_archived": self.is_archived("leads", i),
            "was_seen": rng.random() < 0.7,
            "value": {"amount": float(rng.randrange(1, 100) * 100), "currency": rng.choice(CURRENCIES)} if rng.random() < 0.6 else None,
            "expected_close_date": day(add + rng.randrange(14, 120) * 86400) if rng.random() < 0.5 else None,
            "next_activity_id": None,
            "add_time": iso_ms(add),
            "update_time": iso_ms(self.update_ts("leads", i)),
            "visible_to": rng.choice(("3", "3", "7")),
            "cc_email": f"{self.company_domain.split('.')[0]}+lead{self.lead_uuid(i).replace('-', '')[:20]}@pipedrivemail.example",
        }
        # Leads inherit the deal custom fields; v1 style: top-level keys, only when set.
        for key, value in self.custom_values("deal", "leads", i).items():
            if value is None:
                continue
            if isinstance(value, dict):  # monetary
                rec[key] = value["value"]
                rec[f"{key}_currency"] = value["currency"]
            elif isinstance(value, list):  # set: comma separated option ids, as v1 does
                rec[key] = ",".join(str(v) for v in value)
            else:
                rec[key] = value
        return rec

    def _target(self, kind: str, i: int, rng: random.Random) -> dict[str, Any]:
        """What an activity or note is attached to: ids of deal, lead, person and organization."""
        r = rng.random()
        deal_id = lead_id = person_id = org_id = None
        if r < 0.5 and self.counts["deals"]:
            d = rng.randrange(self.counts["deals"])
            deal_id = index_to_id("deals", d)
            p, o = self.deal_person(d), self.deal_org(d)
            person_id = index_to_id("persons", p) if p is not None else None
            org_id = index_to_id("organizations", o) if o is not None else None
        elif r < 0.75:
            p = rng.randrange(self.counts["persons"])
            person_id = index_to_id("persons", p)
            o = self.person_org(p)
            org_id = index_to_id("organizations", o) if o is not None else None
        elif r < 0.9:
            org_id = index_to_id("organizations", rng.randrange(self.counts["organizations"]))
        else:
            lead_id = self.lead_uuid(rng.randrange(self.counts["leads"]))
        if self.is_dangling(kind, i):
            if deal_id is not None:
                deal_id = self.dangling_ref(kind, i, "deals")
            elif person_id is not None:
                person_id = self.dangling_ref(kind, i, "persons")
            elif org_id is not None:
                org_id = self.dangling_ref(kind, i, "organizations")
            else:
                lead_id = make_uuid(self._h(S_DANGLE, 77, i), self._h(S_DANGLE, 78, i))
        return {"deal_id": deal_id, "lead_id": lead_id, "person_id": person_id, "org_id": org_id}

    def _build_activities(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["activities"]
        rng = self._rng(S_RECORD, code, i)
        t = self._target("activities", i, rng)
        add = self.add_ts("activities", i)
        due = add + 7 * 86400
        done = due < T_END - 10 * 86400 and rng.random() < 0.8
        owner = 1 + rng.randrange(self.counts["users"])
        atype = rng.choice(ACTIVITY_TYPES)
        return {
            "id": index_to_id("activities", i),
            "subject": f"{atype.capitalize()}: {rng.choice(PRODUCTS)}",
            "type": atype,
            "owner_id": owner,
            "creator_user_id": owner,
            "is_deleted": False,
            "add_time": rfc3339(add),
            "update_time": rfc3339(self.update_ts("activities", i)),
            "deal_id": t["deal_id"],
            "lead_id": t["lead_id"],
            "person_id": t["person_id"],
            "org_id": t["org_id"],
            "project_id": None,
            "due_date": day(due),
            "due_time": f"{rng.randrange(8, 18):02d}:{rng.choice((0, 15, 30, 45)):02d}",
            "duration": rng.choice(("00:15", "00:30", "01:00")),
            "busy": rng.random() < 0.5,
            "done": done,
            "marked_as_done_time": rfc3339(due + 3600) if done else None,
            "location": None,
            "participants": [{"person_id": t["person_id"], "primary": True}] if t["person_id"] is not None else [],
            "attendees": [],
            "conference_meeting_client": None,
            "conference_meeting_url": None,
            "conference_meeting_id": None,
            "public_description": "",
            "priority": None,
            "note": f"<p>{rng.choice(('Follow up', 'Send proposal', 'Demo', 'Check budget'))}</p>" if rng.random() < 0.5 else None,
        }

    def _build_notes(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["notes"]
        rng = self._rng(S_RECORD, code, i)
        t = self._target("notes", i, rng)
        user = 1 + rng.randrange(self.counts["users"])
        first, last = self.user_name(user)
        rec: dict[str, Any] = {
            "id": index_to_id("notes", i),
            "active_flag": True,
            "add_time": v1_time(self.add_ts("notes", i)),
            "update_time": v1_time(self.update_ts("notes", i)),
            "content": f"<p>{rng.choice(('Called', 'Emailed', 'Met'))} about {rng.choice(PRODUCTS).lower()}; next step: {rng.choice(('quote', 'demo', 'contract', 'wait'))}.</p>",
            "deal_id": t["deal_id"],
            "lead_id": t["lead_id"],
            "person_id": t["person_id"],
            "org_id": t["org_id"],
            "project_id": None,
            "task_id": None,
            "last_update_user_id": user,
            "user_id": user,
            "pinned_to_deal_flag": t["deal_id"] is not None and rng.random() < 0.1,
            "pinned_to_organization_flag": False,
            "pinned_to_person_flag": False,
            "pinned_to_project_flag": False,
            "pinned_to_task_flag": False,
            "pinned_to_lead_flag": False,
            "user": {"email": self.user_email(user), "icon_url": None, "is_you": user == 1, "name": f"{first} {last}"},
        }
        d = id_to_index("deals", t["deal_id"]) if t["deal_id"] is not None else None
        rec["deal"] = {"title": self.deal_title(d)} if d is not None and self.exists("deals", d) else None
        o = id_to_index("organizations", t["org_id"]) if t["org_id"] is not None else None
        rec["organization"] = {"name": self.org_name(o)} if o is not None and self.exists("organizations", o) else None
        p = id_to_index("persons", t["person_id"]) if t["person_id"] is not None else None
        rec["person"] = {"name": " ".join(self.person_name(p))} if p is not None and self.exists("persons", p) else None
        rec["project"] = None
        rec["task"] = None
        return rec

    def _build_pipelines(self, i: int) -> dict[str, Any]:
        names = ("Sales", "Partners", "Renewals", "Enterprise", "Inbound", "Outbound", "Channel")
        return {
            "id": i + 1,
            "name": names[i % len(names)] + ("" if i < len(names) else f" {i + 1}"),
            "order_nr": i + 1,
            "is_deleted": False,
            "is_deal_probability_enabled": i == 0,
            "add_time": rfc3339(T0 - 86400 * 20 + i * 3600),
            "update_time": rfc3339(T0 - 86400 * 10 + i * 3600),
        }

    def _build_stages(self, i: int) -> dict[str, Any]:
        names = ("Qualified", "Contact made", "Proposal made", "Negotiation", "Verbal yes", "Contract sent")
        per = self.spec.stages_per_pipeline
        pos = i % per
        return {
            "id": i + 1,
            "order_nr": pos + 1,
            "name": names[pos % len(names)],
            "is_deleted": False,
            "deal_probability": min(100, 20 * (pos + 1)),
            "pipeline_id": self.stage_pipeline(i) + 1,
            "is_deal_rot_enabled": pos == 0,
            "days_to_rotten": 30 if pos == 0 else None,
            "add_time": rfc3339(T0 - 86400 * 20 + i * 60),
            "update_time": rfc3339(T0 - 86400 * 10 + i * 60),
        }

    def _party(self, pid: int, email: str, name: str, person_id: int | None) -> dict[str, Any]:
        return {
            "id": pid,
            "email_address": email,
            "name": name,
            "linked_person_id": person_id,
            "linked_person_name": name if person_id is not None else None,
            "mail_message_party_id": pid,
        }

    def _build_mail_messages(self, message_index: int) -> dict[str, Any]:
        """The `data` object of a mail message (index = id - 1), without the body."""
        mid = message_index + 1
        loc = self.message_location(mid)
        assert loc is not None
        d, pos = loc
        rng = self._rng(S_RECORD, KIND_CODE["mail_messages"], message_index)
        owner = self.deal_owner(d)
        p = self.deal_person(d)
        o = self.deal_org(d)
        user_party = self._party(2 * mid, self.user_email(owner), " ".join(self.user_name(owner)), None)
        if p is not None and self.person_emails(p):
            contact = self._party(2 * mid + 1, self.person_emails(p)[0], " ".join(self.person_name(p)), index_to_id("persons", p))
        else:
            domain = self.org_domain(o) if o is not None else FREEMAIL[mid % len(FREEMAIL)]
            contact = self._party(2 * mid + 1, f"info{mid % 97}@{domain}", "", None)
        inbound = rng.random() < 0.55
        sender, receiver = (contact, user_party) if inbound else (user_party, contact)
        deal_add = self.add_ts("deals", d)
        span = max(3600, T_END - deal_add)
        t = deal_add + (span * (pos + 1)) // (len(self.deal_message_ids(d)) + 1) + rng.randrange(0, 3600)
        subject = ("Re: " if pos else "") + self.deal_title(d)
        has_attach = rng.random() < 0.15
        return {
            "id": mid,
            "from": [sender],
            "to": [receiver],
            "cc": [],
            "bcc": [],
            "body_url": f"https://{self.company_domain.split('.')[0]}.pipedrive.example/v1/mailbox/mailMessages/{mid}/body",
            "account_id": f"acct{owner:06d}",
            "user_id": owner,
            "mail_thread_id": 1_000_000 + index_to_id("deals", d) * 4 + pos // 25,
            "subject": subject,
            "snippet": f"Hello, following up on {subject[:60]}",
            "mail_tracking_status": rng.choice(("opened", "not opened", None)),
            "mail_link_tracking_enabled_flag": 0,
            "read_flag": 1,
            "draft": "",
            "draft_flag": 0,
            "synced_flag": 1,
            "deleted_flag": 0,
            "has_body_flag": 1,
            "sent_flag": 0 if inbound else 1,
            "sent_from_pipedrive_flag": 0 if inbound else int(rng.random() < 0.5),
            "smart_bcc_flag": 0,
            "message_time": iso_ms(t),
            "add_time": iso_ms(t + 5),
            "update_time": iso_ms(t + 60),
            "has_attachments_flag": int(has_attach),
            "has_inline_attachments_flag": 0,
            "has_real_attachments_flag": int(has_attach),
            "nylas_id": f"{mix(self.seed, mid):016x}",
            "s3_bucket": "pipedrive-mail-sandbox",
            "s3_bucket_path": f"sandbox/{owner}/nylas/{mid}/body",
            "external_deleted_flag": False,
            "mua_message_id": f"{mix(self.seed, mid, 2):016x}@mailer.example",
            "item_type": "mailMessage",
            "timestamp": iso_ms(t + 60),
            "company_id": self.company()["company_id"],
        }

    def mail_body(self, message_id: int, badrow_rate: float = 0.0) -> str:
        """The HTML body of a message (a few KB; hostile when the message is malformed)."""
        rng = self._rng(S_RECORD, KIND_CODE["mail_messages"], message_id - 1, 99)
        loc = self.message_location(message_id)
        d = loc[0] if loc else 0
        paragraphs = [
            f"<p>{rng.choice(('Hi', 'Hello', 'Dear team'))},</p>",
            f"<p>Regarding {self.deal_title(d)}: {rng.choice(('attached is the quote', 'can we meet next week', 'thanks for the call', 'please find the contract'))}.</p>",
        ]
        for _ in range(rng.randrange(3, 30)):
            paragraphs.append("<p>" + " ".join(rng.choice(BODY_WORDS) for _ in range(rng.randrange(10, 40))) + ".</p>")
        if self.is_malformed("mail_messages", message_id - 1, badrow_rate):
            paragraphs.append(f"<p>{HTML_INJECTION}{HOSTILE_UNICODE}\u0000{SQL_INJECTION}</p>")
        paragraphs.append("<p>Best regards</p>")
        return "\n".join(paragraphs)

    def mail_list_item(self, message_id: int, badrow_rate: float = 0.0) -> dict[str, Any]:
        """Message `message_id` as `/v1/deals/{id}/mailMessages` lists it: `{object: "mailMessage",
        timestamp: "YYYY-MM-DD HH:MM:SS", data: <the message without body>}`."""
        data = self.record("mail_messages", message_id - 1, badrow_rate)
        ts = data.get("timestamp") if isinstance(data.get("timestamp"), str) else iso_ms(T0)
        return {"object": "mailMessage", "timestamp": ts.replace("T", " ")[:19], "data": data}

    def _malform(self, kind: str, index: int, rec: dict[str, Any]) -> dict[str, Any]:
        rec = dict(rec)
        variant = self.malformed_variant(kind, index)
        name_field = NAME_FIELD[kind]
        original = rec.get(name_field)
        if variant == "missing_id":
            rec.pop("id", None)
        elif variant == "id_string":
            rec["id"] = "abc"
        elif variant == "name_dict":
            rec[name_field] = {"value": original, "nested": {"oops": True}}
        elif variant == "oversize":
            rec[name_field] = (str(original) + " ") + ("x" * 100_000)
        elif variant == "nul_bytes":
            rec[name_field] = f"{original}\u0000\u0000tail"
        elif variant == "sql_injection":
            rec[name_field] = SQL_INJECTION
        elif variant == "html_injection":
            rec[name_field] = HTML_INJECTION
        elif variant == "hostile_unicode":
            rec[name_field] = f"{original} {HOSTILE_UNICODE}"
        elif variant == "wrong_types":
            for key in ("owner_id", "user_id", "add_time", "update_time"):
                if key in rec:
                    rec[key] = {"owner_id": "seven", "user_id": [1, 2], "add_time": 1234567890, "update_time": True}[key]
            if "custom_fields" in rec:
                rec["custom_fields"] = ["not", "an", "object"]
        return rec
