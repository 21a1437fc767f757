"""A deal whose mail listing answers 403 while the token reads the account (the deal's mail is
private to another user) is that deal's outcome: its mail is told unreachable with the reason -
beside the ledger, in the grouped reasons, by explain, as verify's `unreachable` - every other
deal's mail is imported, and the run finishes. Reconciled against the sandbox's truth
(`private_deal_mail`)."""
from __future__ import annotations

from engine_core import rollup, row_story
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import compare, verify
from tests.pipedrive.support import FAST, actions, failed_tasks, ledger, migrate, sandbox

TENANT = "acme"


def test_a_deal_whose_mail_listing_is_forbidden_is_that_deals_outcome_and_the_run_finishes(db) -> None:
    with sandbox(private_deal_mail=2) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["emails"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    forbidden = {str(d["deal_id"]): [str(m) for m in d["messages"]] for d in truth["private_deal_mail"]}
    assert len(forbidden) == 2 and all(forbidden.values())
    # every other deal's mail is here - the deals sharing a task with a forbidden one included
    reachable = {str(m) for d, ms in truth["deals_with_mail"].items() if d not in forbidden for m in ms}
    mail = ledger(db, TENANT, "emails")
    assert reachable and reachable == actions(mail, "created"), sorted(reachable ^ actions(mail, "created"))[:10]
    assert not {m for ms in forbidden.values() for m in ms} & set(mail)
    # told as the deal's, with the reason: beside the ledger, grouped, explained
    told = db.sql("SELECT raw_key, reason FROM migration_unreadable WHERE migration_id = %(r)s AND kind = 'emails'",
                  {"r": run.id})
    assert {t["raw_key"] for t in told} == {f"deal {d}" for d in forbidden}, told
    assert all("HTTP 403" in t["reason"] for t in told), told
    groups = [g for g in rollup.grouped_reasons(db, run.id) if g["kind"] == "emails" and "HTTP 403" in g["reason"]]
    assert len(groups) == 1 and groups[0]["count"] == len(forbidden), groups
    for d in forbidden:
        story = row_story.explain(db, TENANT, "emails", f"deal {d}")
        assert story is not None and story["action"] == "failed" and "HTTP 403" in story["reason"], story
    # the proof: the forbidden deals are unreachable, not missing, and the proof passes
    (emails,) = proof.kinds
    assert proof.passed and not emails.missing and not emails.extra, emails.as_dict()
    assert set(emails.unreachable) == {f"deal {d}" for d in forbidden}, emails.as_dict()
    assert emails.source == len(reachable)


def test_mail_an_earlier_run_wrote_under_a_deal_now_unreachable_is_not_extra() -> None:
    entry = {"action": "created", "record_type": "crm.emails", "record_id": 1, "version": None, "deleted": None}
    result = compare("emails", ["emails"], {"7": None}, {"7": dict(entry), "8": dict(entry, record_id=2)},
                     {"7": [True], "8": [True]}, {}, unreachable={"deal 12": ("HTTP 403", ["8"])})
    assert result.extra == [] and result.missing == [] and result.unreachable == {"deal 12": "HTTP 403"}
    assert compare("emails", ["emails"], {"7": None}, {"7": dict(entry), "8": dict(entry, record_id=2)},
                   {"7": [True], "8": [True]}, {}).extra == ["8"], "without the deal's refusal it is extra"
