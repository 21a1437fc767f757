"""One item's sub-resource refused is that item's outcome, never the token's: a 403 or 404 on a
deal's mail listing raises `ItemRefused` (not `AuthError`), and `settle_refusals` stops a fan-out
only when the token itself is refused - a 401, or a 403 on the account's own identity."""
from __future__ import annotations

import httpx
import pytest

from engine_core.providers.pipedrive.paging import settle_refusals
from engine_core.providers.pipedrive.errors import AuthError, BodyUnavailable, ItemRefused
from tests.client.support import Script, make_client, ok, status

ME = {"id": 7, "company_id": 12, "company_domain": "acme"}


def _routes(answers: dict[str, httpx.Response]) -> Script:
    """Answers by path (the mail listing of deal 12, the account's identity)."""
    return Script([lambda request: answers[request.url.path]])


@pytest.mark.parametrize("code", [403, 404])
def test_a_refused_deal_mail_listing_is_the_deals_outcome(code: int) -> None:
    script = _routes({"/v1/deals/12/mailMessages": status(code, body={"success": False, "error": "not yours"})})
    client, sleeps = make_client(script)
    with pytest.raises(ItemRefused) as info:
        client.mail_messages(12)
    assert not isinstance(info.value, AuthError)
    assert info.value.status == code and len(script.requests) == 1 and sleeps == []
    assert "GET /v1/deals/12/mailMessages" in str(info.value)


def test_a_401_on_a_deal_mail_listing_is_still_the_token() -> None:
    client, _ = make_client(_routes({"/v1/deals/12/mailMessages": status(401)}))
    with pytest.raises(AuthError):
        client.mail_messages(12)


def test_a_refused_mail_body_is_body_unavailable_an_item_refusal() -> None:
    client, _ = make_client(Script([status(403)]))
    with pytest.raises(BodyUnavailable) as info:
        client.mail_body(5)
    assert isinstance(info.value, ItemRefused) and info.value.status == 403


def _refusal(client, deal: int = 12) -> ItemRefused:
    with pytest.raises(ItemRefused) as info:
        client.mail_messages(deal)
    return info.value


def test_a_403_stays_the_items_while_the_account_identity_answers_and_is_asked_once() -> None:
    script = _routes({"/v1/deals/12/mailMessages": status(403), "/v1/deals/13/mailMessages": status(403),
                      "/v1/users/me": ok(ME)})
    client, _ = make_client(script)
    settle_refusals(client, [_refusal(client, 12)])
    settle_refusals(client, [_refusal(client, 13)])
    asked = [r.url.path for r in script.requests]
    assert asked.count("/v1/users/me") == 1, asked


@pytest.mark.parametrize("code", [401, 403])
def test_a_403_whose_account_identity_is_refused_too_is_the_token(code: int) -> None:
    script = _routes({"/v1/deals/12/mailMessages": status(403), "/v1/users/me": status(code)})
    client, _ = make_client(script)
    with pytest.raises(AuthError) as info:
        settle_refusals(client, [_refusal(client)])
    assert info.value.status == code and "/v1/users/me" in str(info.value)


def test_a_404_alone_asks_nothing_more() -> None:
    script = _routes({"/v1/deals/12/mailMessages": status(404)})
    client, _ = make_client(script)
    settle_refusals(client, [_refusal(client)])
    assert [r.url.path for r in script.requests] == ["/v1/deals/12/mailMessages"]
