"""include_fields=email_messages_count on deal lists: the count of each deal's mail, as the spec documents."""
from __future__ import annotations

import httpx

from pipedrive_sandbox.config import SandboxConfig
from pipedrive_sandbox.server import SandboxServer


def test_deal_lists_report_email_messages_count_when_asked() -> None:
    with SandboxServer(SandboxConfig(scale="tiny", seed=3)) as sb:
        truth = sb.truth()
        with_mail = {int(k): len(v) for k, v in truth["deals_with_mail"].items()}
        seen: dict[int, int] = {}
        for path in ("/api/v2/deals", "/api/v2/deals/archived"):
            cursor = None
            while True:
                params = {"limit": 500, "include_fields": "email_messages_count"}
                if cursor:
                    params["cursor"] = cursor
                body = httpx.get(sb.base_url + path, params=params, headers={"x-api-token": "sandbox-token"}).json()
                for row in body["data"]:
                    if isinstance(row, dict) and isinstance(row.get("id"), int):
                        seen[row["id"]] = row["email_messages_count"]
                cursor = body["additional_data"]["next_cursor"]
                if not cursor:
                    break
        assert {d: n for d, n in seen.items() if n} == with_mail
        plain = httpx.get(sb.base_url + "/api/v2/deals", params={"limit": 5}, headers={"x-api-token": "sandbox-token"}).json()
        assert all("email_messages_count" not in r for r in plain["data"] if isinstance(r, dict))
