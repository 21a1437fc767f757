"""The sandbox's own namespace `/_sandbox/` (no auth): health, stats, truth, config and the live account."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .data import Dataset
from .envelope import envelope_error, json_response
from .listing import Lister
from .live import LIVE_TRUTH_KINDS
from .live_crm import CRM_TRUTH_KINDS
from .shapes import SHAPE_TRUTH_KINDS
from .stats import Stats


class Admin(Lister):
    """The sandbox's own endpoints under `/_sandbox/` (no auth): what tests and benches read the
    account's truth and the traffic from, and how they change options or step the live account."""

    def routes(self) -> list[Route]:
        """The Starlette routes of `/_sandbox/`."""
        return [
            Route("/_sandbox/health", self.health, methods=["GET"]),
            Route("/_sandbox/stats", self.get_stats, methods=["GET"]),
            Route("/_sandbox/stats/reset", self.reset_stats, methods=["POST"]),
            Route("/_sandbox/truth", self.get_truth, methods=["GET"]),
            Route("/_sandbox/config", self.config_endpoint, methods=["GET", "POST"]),
            Route("/_sandbox/live", self.live_status, methods=["GET"]),
            Route("/_sandbox/live/step", self.live_step, methods=["POST"]),
            Route("/_sandbox/live/stop", self.live_stop, methods=["POST"]),
            Route("/_sandbox/changes", self.live_changes, methods=["GET"]),
        ]

    async def health(self, request: Request) -> Response:
        """`GET /_sandbox/health`: `{ok, scale, seed}`: the server is up and which account it serves."""
        return json_response(200, {"ok": True, "scale": self.state.config.scale, "seed": self.state.config.seed})

    async def get_stats(self, request: Request) -> Response:
        """`GET /_sandbox/stats`: the traffic counters (Stats), the daily budget's state and the public config."""
        body = self.state.stats.to_json()
        body["daily"] = self.state.limiter.daily_state()
        body["config"] = self.state.config.public_dict()
        return json_response(200, body)

    async def reset_stats(self, request: Request) -> Response:
        """`POST /_sandbox/stats/reset`: start the traffic counters over (the limits keep their state)."""
        self.state.stats = Stats()
        return json_response(200, {"ok": True})

    async def get_truth(self, request: Request) -> Response:
        """`GET /_sandbox/truth[?kind=K[&rows=1]]`: what the account holds now, for reconciliation.

        Without `kind`, every part of the core kinds; with it, that part only (a truth kind, or
        deals_with_mail, malformed, dangling, dangling_refs, counts, the shapes' and live account's
        kinds, and the CRM families - products, deal_products, files, participants, followers,
        deal_history - which only `kind=` asks for: `LiveCrm.crm_truth` says what each holds).
        `rows=1` (a truth kind or products) adds each row exactly as the API serves it now. 400
        names the valid kinds."""
        kind = request.query_params.get("kind") or None
        rows = request.query_params.get("rows") in ("1", "true", "yes")
        row_kinds = (*Dataset.TRUTH_KINDS, "products")
        if rows and kind not in row_kinds:
            return json_response(400, envelope_error(400, f"rows=1 needs kind= one of: {', '.join(row_kinds)} (got {kind!r})"))
        with self.state.lock:
            if kind in CRM_TRUTH_KINDS:
                body = self.state.live.crm_truth(kind)
                if rows:
                    body["rows"] = {str(ident): self._truth_row(kind, ident) for ident in body["ids"][kind]}
                return json_response(200, body)
            try:
                if kind in SHAPE_TRUTH_KINDS or kind in LIVE_TRUTH_KINDS:
                    body = {"scale": self.ds.scale, "seed": self.ds.seed}
                else:
                    body = self.ds.truth(self.state.badrow, kind)
            except KeyError:
                valid = list(Dataset.TRUTH_KINDS) + ["deals_with_mail", "malformed", "dangling", "dangling_refs", "counts", *SHAPE_TRUTH_KINDS, *LIVE_TRUTH_KINDS, *CRM_TRUTH_KINDS]
                return json_response(400, envelope_error(400, f"unknown truth kind {kind!r}; one of: {', '.join(valid)}"))
            body = self.state.shapes.extend_truth(body, kind)
            body = self.state.live.extend_truth(body, kind)
            if rows:
                assert kind is not None
                body["rows"] = {str(ident): self._truth_row(kind, ident) for ident in body["ids"][kind]}
        return json_response(200, body)

    def _truth_row(self, name: str, ident: Any) -> dict[str, Any]:
        """A row of a truth kind exactly as the API serves it now (mail: the message without body)."""
        kind = name.removesuffix("_archived")
        if kind == "mail_messages":
            item = self._mail_item(int(ident))
            return item["data"]
        index = self.state.live.index_of(kind, ident)
        assert index is not None
        return self._record(kind, index)

    async def live_status(self, request: Request) -> Response:
        """`GET /_sandbox/live`: the live account status `{applied, running, rate, max, mix}`."""
        with self.state.lock:
            return json_response(200, self.state.live.status())

    async def live_step(self, request: Request) -> Response:
        """`POST /_sandbox/live/step` `{"n": N}`: apply N changes now; 400 when N is not 1..100000."""
        try:
            body = json.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object like {\"n\": 10}")
            changes = self.state.live.step(body.get("n", 1))
        except ValueError as exc:
            return json_response(400, envelope_error(400, str(exc)))
        return json_response(200, {"changes": changes, "applied": self.state.live.applied})

    async def live_stop(self, request: Request) -> Response:
        """`POST /_sandbox/live/stop`: stop the background changes; answers the status."""
        self.state.live.stop()
        with self.state.lock:
            return json_response(200, self.state.live.status())

    async def live_changes(self, request: Request) -> Response:
        """`GET /_sandbox/changes?since_seq=N`: the changes applied after seq N; 400 for a bad N."""
        raw = request.query_params.get("since_seq") or "0"
        try:
            since = int(raw)
            if since < 0:
                raise ValueError
        except ValueError:
            return json_response(400, envelope_error(400, f"invalid since_seq {raw!r}: an integer >= 0 is required"))
        with self.state.lock:
            return json_response(200, {"changes": self.state.live.changes(since), "applied": self.state.live.applied})

    async def config_endpoint(self, request: Request) -> Response:
        """`GET|POST /_sandbox/config`: the public config; a POSTed JSON object changes options at run
        time (SandboxState.reconfigure); 400 names a bad option."""
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("the body must be a JSON object")
                self.state.reconfigure(changes)
            except ValueError as exc:
                return json_response(400, envelope_error(400, str(exc)))
        return json_response(200, self.state.config.public_dict())
