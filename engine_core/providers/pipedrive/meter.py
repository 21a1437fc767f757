"""What a task spends at the source: every request counted, with its tokens.

`token_cost(path)` is the `x-token-cost` of one GET (`kinds.TOKEN_COSTS`: a v2 list 10, a v1 list
20, a record by id 1-2, a deal's mail listing 20, a download 20). `CountingClient` is the
provider's client as one task uses it (thread-safe: its stats say what the task spent; the rollup
sums them per run). `Meter` is the lighter client of a walk (the catch-up's pages, verify's
listings): the calls a walk makes, each counted into a `cost` dict (`requests`, `tokens`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.kinds import FAN_OUT_COSTS, PAGE, TOKEN_COSTS
from engine_core.providers.pipedrive.paging import Page


def token_cost(path: str) -> int:
    """The tokens one GET of `path` costs (a deal's mail listing 20, a record or a mail body by id
    1 in v2 and 2 in v1)."""
    if path in TOKEN_COSTS:
        return TOKEN_COSTS[path]
    if path.endswith("/mailMessages"):
        return TOKEN_COSTS["mailMessages"]
    for suffix, cost in FAN_OUT_COSTS.items():  # a record's participants, followers, changelog
        if path.endswith(suffix):
            return cost
    if path.endswith("/download"):
        return TOKEN_COSTS["download"]
    return TOKEN_COSTS["v2 single"] if path.startswith("/api/v2/") else TOKEN_COSTS["v1 single"]


class CountingClient:
    """The provider's client as one task uses it: every request it asks for is counted (thread-safe:
    mail bodies are fetched on other threads), `requests` and `tokens` at the endpoint's cost, so a
    task's stats say what it spent at the source (the rollup sums them per run: a sync's cost). A
    request the client retries counts once (the source may have charged the failed attempts too)."""

    def __init__(self, client: PipedriveClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self.requests = 0
        self.tokens = 0

    def _count(self, path: str, n: int = 1) -> None:
        with self._lock:
            self.requests += n
            self.tokens += n * token_cost(path)

    @property
    def inner(self) -> PipedriveClient:
        """The client counted (for requests another thread makes, counted when their answer is
        used: `count`)."""
        return self._client

    def count(self, path: str) -> None:
        """Count one request of `path` made elsewhere for this task (a page read ahead for it:
        `inventory.ReadAhead`), at its cost."""
        self._count(path)

    def get(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """`PipedriveClient.get`, counted; raises as it does."""
        self._count(path)
        return self._client.get(path, params, **kw)

    def list_v1(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Page:
        """`PipedriveClient.list_v1` (one offset-paged v1 page), counted; raises as it does."""
        self._count(path)
        return self._client.list_v1(path, params, **kw)

    def list_v2(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Page:
        """`PipedriveClient.list_v2` (one cursor-paged v2 page), counted - unless the page was
        held for this request after another task paid for it (`Page.kept`); raises as it does."""
        self._count(path)
        page = self._client.list_v2(path, params, **kw)
        if page.kept:
            self._count(path, -1)
        return page

    def iter_v1(self, path: str, params: Mapping[str, Any] | None = None, *, start: int = 0, **kw: Any) -> Iterator[Page]:
        """Every v1 page from offset `start` on, following `additional_data.pagination`
        (`next_start`) until `more_items_in_collection` is false; each page counted."""
        while True:
            page = self.list_v1(path, params, start=start, **kw)
            yield page
            if not page.more or page.next_start is None:
                return
            start = page.next_start

    def iter_v2(self, path: str, params: Mapping[str, Any] | None = None, *, cursor: str | None = None, **kw: Any) -> Iterator[Page]:
        """Every v2 page from `cursor` on, following `additional_data.next_cursor` until it is
        null; each page counted."""
        while True:
            page = self.list_v2(path, params, cursor=cursor, **kw)
            yield page
            if not page.more:
                return
            cursor = page.next_cursor

    def mail_messages(self, deal_id: int, *args: Any, **kw: Any) -> Page:
        """`PipedriveClient.mail_messages` (a page of a deal's mail listing), counted at its
        token cost (`TOKEN_COSTS["mailMessages"]`)."""
        self._count("/mailMessages")
        return self._client.mail_messages(deal_id, *args, **kw)

    def download(self, path: str, **kw: Any) -> Any:
        """`PipedriveClient.download` (a file's bytes, streamed), counted at its token cost."""
        self._count(path)
        return self._client.download(path, **kw)

    def mail_body(self, message_id: int, *args: Any, **kw: Any) -> Any:
        """`PipedriveClient.mail_body` (one message with its body), counted."""
        self._count("/v1/mailbox/mailMessages/{id}")
        return self._client.mail_body(message_id, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass
class Meter:
    """The client, counting every request into `cost` (`requests`, `tokens`)."""

    client: PipedriveClient
    cost: dict[str, int] = field(default_factory=dict)
    cancel: Any = None
    # items whose sub-resource the source refused while the token reads the account: "deal 12" ->
    # (the reason, the source ids the product holds under it), for verify to tell them unreachable
    unreachable: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    held: Callable[[str], list[str]] | None = None  # a deal's source id -> the mail ids the product holds

    def _count(self, path: str) -> None:
        self.cost["requests"] = int(self.cost.get("requests", 0)) + 1
        self.cost["tokens"] = int(self.cost.get("tokens", 0)) + token_cost(path)

    def list_v1(self, path: str, params: Mapping[str, Any] | None, start: int, limit: int = PAGE) -> Page:
        """One v1 page of `limit` rows (default `PAGE`) from offset `start`, counted into `cost`."""
        self._count(path)
        return self.client.list_v1(path, params, start=start, limit=limit, cancel=self.cancel)

    def list_v2(self, path: str, params: Mapping[str, Any] | None, cursor: str | None) -> Page:
        """One v2 page of `PAGE` rows from `cursor` (None: the first), counted into `cost`."""
        self._count(path)
        return self.client.list_v2(path, params, cursor=cursor, limit=PAGE, cancel=self.cancel)

    def get(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """One GET of `path` (a record by id, a record's list), counted into `cost`."""
        self._count(path)
        kw["cancel"] = kw.get("cancel") or self.cancel
        return self.client.get(path, params, **kw)

    def item_list_v1(self, path: str, params: Mapping[str, Any] | None, start: int) -> Page:
        """A page of one item's sub-resource (`PipedriveClient.item_list_v1`: 403/404 raise `ItemRefused`)."""
        self._count(path)
        return self.client.item_list_v1(path, params, start=start, limit=PAGE, cancel=self.cancel)

    def download(self, path: str, **kw: Any) -> Any:
        """`PipedriveClient.download` (a file's bytes, streamed), counted into `cost` at its token
        cost: the client `contents.fetch` downloads through, each try counted."""
        self._count(path)
        kw["cancel"] = kw.get("cancel") or self.cancel
        return self.client.download(path, **kw)

    def confirm_token(self, **kw: Any) -> Any:
        """`PipedriveClient.confirm_token` (not counted): a refused item is the item's only while
        the token itself reads the account (`paging.settle_refusals`)."""
        return self.client.confirm_token(**kw)
