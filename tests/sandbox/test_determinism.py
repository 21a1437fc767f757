"""Determinism of the generated account: same seed, same data; another seed, other data.

Pins that records depend only on (scale, seed, kind, index) - not on the process, its hash seed,
or the order records are asked for - and that the shape of the account is real: relationships,
dangling references at about 2%, emails that match persons, times that grow with ids.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.data import Dataset, GAP_PERIOD

from .conftest import REPO_ROOT, make_client

KINDS = ("users", "organizations", "persons", "deals", "leads", "activities", "notes", "pipelines", "stages")


def digest(ds: Dataset) -> str:
    h = hashlib.sha256()
    for kind in KINDS:
        for i in range(ds.count(kind)):
            h.update(json.dumps(ds.record(kind, i), sort_keys=True).encode())
    for mid in range(1, ds.message_total + 1):
        h.update(json.dumps(ds.mail_list_item(mid), sort_keys=True).encode())
        h.update(ds.mail_body(mid).encode())
    return h.hexdigest()


def test_same_seed_same_data_other_seed_other_data() -> None:
    a, b, c = Dataset("tiny", 1), Dataset("tiny", 1), Dataset("tiny", 2)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)
    # Order of access does not matter.
    backwards = Dataset("tiny", 1)
    assert [backwards.record("deals", i) for i in reversed(range(10))][::-1] == [a.record("deals", i) for i in range(10)]


def test_data_is_stable_across_processes_and_hash_seeds() -> None:
    code = "from pipedrive_sandbox.data import Dataset; from tests.sandbox.test_determinism import digest; print(digest(Dataset('tiny', 1)))"
    outs = []
    for hash_seed in ("1", "999"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(REPO_ROOT))
        outs.append(subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip())
    assert outs[0] == outs[1] == digest(Dataset("tiny", 1))


def test_same_seed_same_pages_over_http() -> None:
    pages = []
    for seed in (4, 4, 5):
        with SandboxServer(SandboxConfig(seed=seed, burst_limit=10**6)) as sb, make_client(sb.base_url) as c:
            pages.append([c.get(p).json() for p in ("/api/v2/persons?limit=500", "/v1/notes?limit=500", "/v1/leads?limit=500")])
    assert pages[0] == pages[1]
    assert pages[0] != pages[2]


def test_account_shape_is_real() -> None:
    ds = Dataset("small", 1)
    truth = ds.truth()
    ids = truth["ids"]
    persons = [ds.record("persons", i) for i in range(ds.count("persons"))]
    org_ids = set(ids["organizations"])
    person_ids = set(ids["persons"])
    # Some persons have no organization; most reference existing organizations.
    assert any(p["org_id"] is None for p in persons)
    dangling_persons = {p["id"] for p in persons if p["org_id"] is not None and p["org_id"] not in org_ids}
    assert dangling_persons == set(truth["dangling"]["persons"])
    assert 0.005 < len(dangling_persons) / len(persons) < 0.04
    # Dangling references point at deleted ids (gaps), not at ids beyond the end.
    assert all(p["org_id"] % GAP_PERIOD == 0 for p in persons if p["id"] in dangling_persons)
    # Deals: dangling set equals the rows whose person or org is missing.
    deals = [ds.record("deals", i) for i in range(ds.count("deals"))]
    bad = {d["id"] for d in deals if (d["person_id"] is not None and d["person_id"] not in person_ids) or (d["org_id"] is not None and d["org_id"] not in org_ids)}
    assert bad == set(truth["dangling"]["deals"])
    # Emails let a consumer match mail to persons.
    emails = {e["value"]: p["id"] for p in persons for e in p["emails"]}
    linked = 0
    for mid in range(1, ds.message_total + 1):
        data = ds.mail_list_item(mid)["data"]
        for party in data["from"] + data["to"]:
            if party["linked_person_id"] is not None:
                linked += 1
                assert emails.get(party["email_address"]) is not None
    assert linked > ds.message_total * 0.5
    # update_time strictly grows with id in every kind.
    for kind in ("organizations", "persons", "deals", "activities"):
        times = [ds.record(kind, i)["update_time"] for i in range(ds.count(kind))]
        assert times == sorted(times) and len(set(times)) == len(times)
    # Notes and activities attach to deals, persons, organizations and leads.
    notes = [ds.record("notes", i) for i in range(ds.count("notes"))]
    assert all(any(n[k] is not None for k in ("deal_id", "person_id", "org_id", "lead_id")) for n in notes)
    assert any(n["lead_id"] for n in notes) and any(n["deal_id"] for n in notes)
    # Duplicate organization names exist, as in real accounts.
    names = [ds.org_name(i) for i in range(ds.count("organizations"))]
    assert len(set(names)) < len(names)


def test_scales_have_the_documented_sizes() -> None:
    tiny, small = Dataset("tiny", 1), Dataset("small", 1)
    assert 200 <= sum(tiny.count(k) for k in KINDS) <= 500 and 20 <= tiny.message_total <= 45
    assert 4500 <= sum(small.count(k) for k in KINDS) <= 5500 and 900 <= small.message_total <= 1100
    assert max(tiny.mail_counts) < 100
    big = Dataset("tiny", 1, big_deal_messages=300)
    assert max(big.mail_counts) == 300
