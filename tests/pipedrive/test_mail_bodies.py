"""Mail Postgres cannot hold as given is imported, never lost (issue 8, item 7): a 1,200,000-
character HTML body with an inline base64 image is cut at `crm.EMAIL_BODY_MAX` with
`body_truncated` and its original length; a body with a NUL lands without it; a body answering 403
(private) or 404 (deleted since listed) lands without a body, `body_unavailable` = the status, a
grouped run-log note, fetched once; a lone UTF-16 surrogate in a subject, snippet or address name
is replaced by U+FFFD. The stats count what was repaired, cut and unavailable."""
from __future__ import annotations

import base64
from collections import Counter

import pytest

from engine_core.providers.pipedrive import mail, mapping
from engine_core.providers.pipedrive.emails import clean_strings, clean_text
from engine_core.providers.pipedrive.kinds import OPT_IN
from engine_core.providers.pipedrive.plan import PHASES
from engine_core.target import crm
from pipedrive_sandbox.app import ApiError
from pipedrive_sandbox.data import Dataset
from tests.pipedrive.support import actions, failed_tasks, ledger, migrate, sandbox

TENANT = "acme"
HUGE = 1_200_000


def huge_body() -> str:
    image = base64.b64encode(bytes(range(256)) * 3500).decode()  # ~1.2 MB of inline image
    html = f'<p>Quote attached.</p><img src="data:image/png;base64,{image}"><p>Best regards</p>'
    return (html + "x" * HUGE)[:HUGE - 4] + "</p>"


def test_hostile_bodies_and_private_messages_are_imported_and_said_so(db, monkeypatch) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        everything_but_mail = [k for group in PHASES for k in group if k != "emails" and k not in OPT_IN]
        assert migrate(db, sb, TENANT, kinds=everything_but_mail).status == "succeeded"
        resolvable = db.sql(
            "SELECT DISTINCT source_id FROM migration_records WHERE tenant_id = %(t)s AND kind IN ('deals', 'deals_archived')"
            " AND action IN ('created', 'matched') AND record_id IS NOT NULL", {"t": TENANT})
        here = {r["source_id"] for r in resolvable}
        mail = sorted((m for d, ms in truth["deals_with_mail"].items() if d in here for m in ms))
        assert len(mail) >= 4
        big, nul, private, deleted = mail[:4]
        original = Dataset.mail_body
        asked: Counter[int] = Counter()  # every body request the sandbox answered, 403/404 included

        def hostile(self: Dataset, message_id: int, badrow_rate: float = 0.0) -> str:
            asked[message_id] += 1
            if message_id == big:
                return huge_body()
            if message_id == nul:
                return "<p>before\u0000after</p>"
            if message_id == private:
                raise ApiError(403, "You do not have permission to view this message")
            if message_id == deleted:
                raise ApiError(404, "Mail message not found")
            return original(self, message_id, badrow_rate)

        monkeypatch.setattr(Dataset, "mail_body", hostile)
        sb.reset_stats()
        run = migrate(db, sb, TENANT, kinds=["emails"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    entries = ledger(db, TENANT, "emails")
    assert {str(m) for m in (big, nul, private, deleted)} <= actions(entries, "created")
    assert not actions(entries, "failed"), {s: e["reason"] for s, e in entries.items() if e["action"] == "failed"}
    mail = [m for m in mail if str(m) in actions(entries, "created")]
    rows = {int(r["source_id"]): r for r in db.sql(
        "SELECT source_id, body, body_truncated, body_original_length, body_unavailable FROM crm.emails"
        " WHERE tenant_id = %(t)s", {"t": TENANT})}

    cut = rows[big]
    assert cut["body_truncated"] and cut["body_original_length"] == HUGE
    assert cut["body"] == "<p>Quote attached.</p>", "cut before the inline image's tag, which cannot render cut open"
    assert rows[nul]["body"] == "<p>beforeafter</p>" and not rows[nul]["body_truncated"]
    assert rows[private]["body"] is None and rows[private]["body_unavailable"] == 403
    assert rows[deleted]["body"] is None and rows[deleted]["body_unavailable"] == 404
    sound = [m for m in mail if m not in (big, nul, private, deleted)]
    assert all(rows[m]["body"] and rows[m]["body_unavailable"] is None and not rows[m]["body_truncated"] for m in sound)
    assert all(asked[m] == 1 for m in mail), {m: asked[m] for m in mail if asked[m] != 1}  # nothing retried

    stats = Counter()
    for t in db.sql("SELECT stats FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'emails'", {"r": run.id}):
        stats.update({k: v for k, v in t["stats"].items() if k != "deals_done_mask"})
    assert stats["bodies_truncated"] == 1 and stats["bodies_unavailable"] == 2 and stats["sanitized"] == 1
    assert stats["failed"] == 0 and stats["bodies"] == len(mail) - 2
    notes = db.sql("SELECT e FROM migrations, jsonb_array_elements(log) AS e WHERE id = %(r)s", {"r": run.id})
    reasons = {n["e"]["reason"]: n["e"]["count"] for n in notes}
    assert any("HTTP 403 (private message)" in r and c == 1 for r, c in reasons.items()), reasons
    assert any("HTTP 404" in r for r in reasons) and any("body cut at" in r for r in reasons), reasons


def test_lone_surrogates_and_nul_in_every_string_of_a_message_become_storable_text(db) -> None:
    item = {"object": "mailMessage", "data": {
        "id": 7, "subject": "Offer \ud800", "snippet": "see\u0000 below \udfff",
        "from": [{"email_address": "a@example.com", "name": "Ann \ud83d"}],
        "to": [{"email_address": "b@example.com", "name": "Bo\u0000b"}], "cc": [], "bcc": [],
        "message_time": "2024-01-02T03:04:05Z", "sent_flag": 1, "has_attachments_flag": 0,
    }}
    cleaned, repaired = clean_strings(item)
    assert repaired == 5
    message = cleaned["data"]
    assert message["subject"] == "Offer \ufffd" and message["snippet"] == "see below \ufffd"
    assert message["from"][0]["name"] == "Ann \ufffd" and message["to"][0]["name"] == "Bob"
    assert clean_text("a real pair \U0001f600 stays") == ("a real pair \U0001f600 stays", 0)
    assert clean_strings(item["data"]["cc"])[0] is item["data"]["cc"], "untouched values are not copied"

    deal = db.sql("INSERT INTO crm.deals (tenant_id, title, source, source_id) VALUES ('t', 'D', 'pipedrive', '1') RETURNING id")[0]["id"]
    mapped = mail.map_email(cleaned, "t", "1")
    values = {**mail.with_body(mapped, {"body": "ok"}).values, "deal_id": deal}
    with db.transaction() as tx:
        crm.insert(tx, "emails", values)  # Postgres takes every string: text and jsonb alike
    stored = db.sql("SELECT subject, snippet, sender, recipients FROM crm.emails WHERE tenant_id = 't'")[0]
    assert stored["subject"] == "Offer \ufffd" and stored["sender"][0]["name"] == "Ann \ufffd"


def test_the_body_cap_is_documented_within_the_mappers_limit_and_cuts_outside_a_tag() -> None:
    assert crm.EMAIL_BODY_MAX <= mapping.TEXT_MAX, "with_body must accept every body the cap lets through"
    fitted = crm.fit_email_body("<p>" + "a" * 20 + '<img src="data:x">', limit=30)
    assert fitted.truncated and fitted.original_length == 41 and fitted.body == "<p>" + "a" * 20
    assert crm.fit_email_body("if a < b then " + "x" * 40, limit=30).body == ("if a < b then " + "x" * 40)[:30]
    assert crm.fit_email_body("short").body == "short" and not crm.fit_email_body("short").truncated
    with pytest.raises(ValueError):
        crm.fit_email_body("x", limit=0)
