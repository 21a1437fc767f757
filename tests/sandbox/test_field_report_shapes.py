"""The shapes of four field reports, served over a real socket, and the truth that names them.

* `private_deal_mail` (a shape): N deals with mail whose mail listing answers 403 while the
  account's identity (`/v1/users/me`) and the deal itself answer; truth names each deal and its
  messages.
* `long_notes` (a shape): N notes served with 1,500,000+ characters (HTML, inline base64 image).
* `convert` (a live op): a lead with activities and notes becomes a new deal; the lead answers
  404 and leaves the lists; its activities and notes carry the deal and no lead, update_time moved.
* `unlink` (a live op): a deal's person is removed (`person_id` null, update_time moved).
* `rename_field` / `relabel_option` / `delete_field` (live ops): the deal fields (v2 and v1) and
  the lead fields serve the new name and label and no longer the deleted field; no record keeps
  the deleted field's value; no record's update_time moves.
Each op weighs 0 in the default mix, so a default live account changes as it did before.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.__main__ import build_parser, config_from_args
from pipedrive_sandbox.config import DEFAULT_LIVE_MIX, parse_live_mix

from .conftest import make_client


@contextmanager
def served(**options: Any) -> Iterator[tuple[SandboxServer, httpx.Client]]:
    with SandboxServer(SandboxConfig(scale="tiny", seed=1, burst_limit=10**6, **options)) as sb, make_client(sb.base_url) as c:
        yield sb, c


def force(sb: SandboxServer, op: str) -> dict[str, Any]:
    sb.configure(live_mix=f"{op}:1")
    (change,) = sb.live_step(1)
    assert change["op"] == op, change
    return change


def test_a_private_deal_mail_listing_answers_403_while_the_account_answers() -> None:
    with served(private_deal_mail=2) as (sb, c):
        truth = sb.truth()
        private = truth["private_deal_mail"]
        assert len(private) == 2 and all(p["messages"] for p in private)
        for p in private:
            assert truth["deals_with_mail"][str(p["deal_id"])] == p["messages"]
            r = c.get(f"/v1/deals/{p['deal_id']}/mailMessages")
            assert r.status_code == 403 and r.json()["success"] is False
            assert c.get(f"/api/v2/deals/{p['deal_id']}").status_code == 200
        assert c.get("/v1/users/me").status_code == 200
        other = next(d for d in truth["deals_with_mail"] if int(d) not in {p["deal_id"] for p in private})
        assert c.get(f"/v1/deals/{other}/mailMessages").status_code == 200


def test_long_notes_are_served_whole_with_their_length_in_truth() -> None:
    with served(long_notes=2) as (sb, c):
        truth = sb.truth(kind="long_notes")["long_notes"]
        assert len(truth) == 2
        for n in truth:
            content = c.get(f"/v1/notes/{n['id']}").json()["data"]["content"]
            assert len(content) == n["length"] >= 1_500_000 and "data:image/png;base64," in content


def test_a_lead_conversion_moves_its_activities_and_notes_to_a_new_deal() -> None:
    with served() as (sb, c):
        lead = force(sb, "convert")
        moved = lead["moved"]
        assert moved.get("activities") and moved.get("notes"), lead
        assert c.get(f"/v1/leads/{lead['id']}").status_code == 404
        deal = c.get(f"/api/v2/deals/{lead['deal_id']}").json()["data"]
        truth = sb.truth()
        assert truth["converted"] == {lead["id"]: lead["deal_id"]} and lead["id"] in truth["deleted"]["leads"]
        assert lead["id"] not in truth["ids"]["leads"] and lead["deal_id"] in truth["ids"]["deals"]
        for kind, path in (("activities", "/api/v2/activities/{}"), ("notes", "/v1/notes/{}")):
            for ident in moved[kind]:
                row = c.get(path.format(ident)).json()["data"]
                assert (row["deal_id"], row["lead_id"]) == (lead["deal_id"], None), row
                assert row["update_time"] is not None
        assert deal["add_time"] is not None


def test_a_lead_without_a_value_converts_to_a_deal_worth_zero_and_the_summary_still_adds_up() -> None:
    """Converted leads without a value (seed 1's 4th and 5th conversions) made deals of value None,
    and /v1/deals/summary then answered 500 on every call."""
    with served() as (sb, c):
        deals = []
        for _ in range(5):
            deals.append(c.get(f"/api/v2/deals/{force(sb, 'convert')['deal_id']}").json()["data"])
        assert all(isinstance(d["value"], (int, float)) and d["currency"] for d in deals), deals
        assert any(d["value"] == 0 for d in deals)
        r = c.get("/v1/deals/summary")
        assert r.status_code == 200 and r.json()["success"] is True


def test_a_deal_whose_person_is_removed_serves_none() -> None:
    with served() as (sb, c):
        change = force(sb, "unlink")
        deal = c.get(f"/api/v2/deals/{change['id']}").json()["data"]
        assert deal["person_id"] is None and change["person_id"] is not None


def test_field_changes_are_served_by_every_field_list_and_move_no_record() -> None:
    with served() as (sb, c):
        deals_before = {d["id"]: d["update_time"] for d in c.get("/api/v2/deals", params={"limit": 500}).json()["data"]}
        renamed, relabelled, deleted = (force(sb, op) for op in ("rename_field", "relabel_option", "delete_field"))
        assert len({renamed["id"], relabelled["id"], deleted["id"]} - {relabelled["id"]}) == 2
        for path, code, name in (("/api/v2/dealFields", "field_code", "field_name"), ("/v1/dealFields", "key", "name"),
                                 ("/v1/leadFields", "key", "name")):
            fields = {f[code]: f for f in c.get(path, params={"limit": 500}).json()["data"]}
            assert deleted["id"] not in fields, path
            assert fields[renamed["id"]][name] == renamed["name"], path
            labels = {o["id"]: o["label"] for o in fields[relabelled["id"]]["options"]}
            assert labels[relabelled["option"]] == relabelled["label"], path
        deals = c.get("/api/v2/deals", params={"limit": 500}).json()["data"]
        assert all(deleted["id"] not in d["custom_fields"] for d in deals)
        assert {d["id"]: d["update_time"] for d in deals} == deals_before
        leads = c.get("/v1/leads", params={"limit": 500}).json()["data"]
        assert all(deleted["id"] not in lead for lead in leads)
        assert sb.truth(kind="field_changes")["field_changes"] == {
            "renamed": {renamed["id"]: renamed["name"]},
            "relabelled": {relabelled["id"]: {str(relabelled["option"]): relabelled["label"]}},
            "deleted": [deleted["id"]],
        }


def test_the_new_ops_and_shapes_are_off_by_default_and_options_everywhere() -> None:
    weights = dict(parse_live_mix(DEFAULT_LIVE_MIX))
    assert all(weights[op] == 0 for op in ("convert", "unlink", "rename_field", "relabel_option", "delete_field"))
    config = SandboxConfig.from_options(private_deal_mail="3", long_notes="1")
    assert (config.private_deal_mail, config.long_notes) == (3, 1)
    assert config_from_args(build_parser().parse_args(config.to_cli_args())) == config
    assert "--long-notes" not in SandboxConfig().to_cli_args()
