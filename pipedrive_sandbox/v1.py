"""The `/v1/` endpoints still served: offset-paginated leads, notes, users, field lists, the deals
summary, a deal's mail messages and one mail message."""
from __future__ import annotations

import itertools
import re
from typing import Any, Callable, Iterable

from .catalog import SINGULAR, Endpoint, ListSpec
from .envelope import ApiError
from .fields import ENTITY_OF_V1_FIELDS, v1_entity_fields, v1_lead_fields, v1_note_fields
from .query import Query, sort_value
from .v1_crm import V1Crm


class V1Api(V1Crm):
    """The `/v1/` handlers still served: leads (active and archived), notes, users, the field lists,
    the deals summary, a deal's mail messages and one mail message.

    v1 lists page by offset: `start`/`limit` (<= 500) in, `additional_data.pagination`
    (`start`, `limit`, `more_items_in_collection`, `next_start` while there is more) out."""

    def _v1_page(
        self,
        kind: str,
        candidates: Iterable[int],
        q: Query,
        pred: Callable[[dict[str, Any]], bool] | None,
        sort: tuple[str, bool] | None,
    ) -> tuple[list[dict[str, Any]], int, int, bool, list[int]]:
        """(rows, start, limit asked, more, indexes of the rows) of one offset page."""
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        size = self.state.shapes.cap(limit)
        out: list[tuple[int, dict[str, Any]]] = []
        if sort is None:
            if pred is None:
                for i in itertools.islice(candidates, start, start + size + 1):
                    out.append((i, self._record(kind, i)))
            else:
                matched = 0
                for i in candidates:
                    rec = self._record(kind, i)
                    if not pred(rec):
                        continue
                    if matched >= start:
                        out.append((i, rec))
                        if len(out) > size:
                            break
                    matched += 1
        else:
            field_name, desc = sort
            rows = [(i, self._record(kind, i)) for i in candidates]
            if pred is not None:
                rows = [r for r in rows if pred(r[1])]
            if field_name == "update_time":
                # Only shape-touched kinds sort times this way: null last ascending, first descending.
                rows.sort(key=lambda r: (r[1].get(field_name) is None, sort_value(r[1].get(field_name))), reverse=desc)
            else:
                rows.sort(key=lambda r: sort_value(r[1].get(field_name)), reverse=desc)
            out = rows[start : start + size + 1]
        more = len(out) > size
        out = out[:size]
        return [rec for _, rec in out], start, limit, more, [i for i, _ in out]

    def _v1_sort(self, q: Query, monotonic: frozenset[str], allowed: tuple[str, ...], kind: str = "") -> tuple[tuple[str, bool] | None, bool]:
        """(fallback sort or None, descending for the index order)."""
        raw = q.get("sort")
        if raw is None:
            return None, False
        first = raw.split(",")[0].strip().split()
        field_name = first[0]
        desc = len(first) > 1 and first[1].upper() == "DESC"
        if len(first) > 1 and first[1].upper() not in ("ASC", "DESC"):
            raise ApiError(400, "Parameter 'sort' must be 'field ASC' or 'field DESC'")
        if field_name not in allowed:
            raise ApiError(400, f"Parameter 'sort' supports: {', '.join(allowed)}")
        if field_name == "update_time" and kind and self.state.live.touches(kind):
            return (field_name, desc), False  # null or moved times do not follow the index
        if field_name in monotonic:
            return None, desc
        return (field_name, desc), False

    def v1_leads(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/leads` or `/v1/leads/archived` (archived leads are only in the second since
        2025-07-15). Filters owner_id, person_id, organization_id; `updated_since` on the active list;
        `sort` as `field ASC|DESC`; `filter_id` answers 404. Pagination also at the top level of
        `additional_data`, as the leads schema documents it."""
        ds = self.ds
        archived = endpoint.spec_path == "/leads/archived"
        if q.get("filter_id") is not None:
            raise ApiError(404, "Filter not found")
        sort, desc = self._v1_sort(
            q,
            frozenset({"add_time", "update_time"}),
            ("id", "title", "owner_id", "creator_id", "was_seen", "expected_close_date", "next_activity_id", "add_time", "update_time"),
            "leads",
        )
        lo, hi = 0, ds.count("leads")
        since = None
        if not archived:
            since = q.time("updated_since")
            if since is not None:
                lo = ds.first_index_at_or_after("leads", since)
        spec = ListSpec("leads", filters=(("owner_id", "owner_id", "int"), ("person_id", "person_id", "int"), ("organization_id", "organization_id", "int")))
        pred = self._filter_pred(spec, q)
        subset = "archived" if archived else "active"
        shapes = self.state.shapes
        if self.state.live.touches("leads") and not shapes.touches("leads"):
            candidates: Iterable[int] = self._live_order("leads", subset, since, None, "id", desc, None)
        elif self.state.live.touches("leads"):
            candidates = [i for _, i in self._shaped_order("leads", subset, since, None, "id", desc)]
        else:
            candidates = self._candidates("leads", subset, lo, hi, desc)
        rows, start, limit, more, served = self._v1_page("leads", candidates, q, pred, sort)
        if not archived:
            shapes.served_active("leads", served)  # archive_flip: archived right after being served
        return {"success": True, "data": rows, "additional_data": _v1_additional(start, limit, more, len(rows), flat=True)}

    def v1_notes(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/notes`: filters by user, lead, deal, person, org, project and task, the
        `pinned_to_*_flag`s, `start_date`/`end_date` (YYYY-MM-DD, on add_time), `updated_since`, and
        `sort`. ApiError 400 for a malformed date or parameter."""
        ds = self.ds
        sort, desc = self._v1_sort(
            q,
            frozenset({"id", "add_time", "update_time"}),
            ("id", "user_id", "deal_id", "person_id", "org_id", "content", "add_time", "update_time"),
            "notes",
        )
        lo, hi = 0, ds.count("notes")
        since = q.time("updated_since")
        if since is not None:
            lo = ds.first_index_at_or_after("notes", since)
        filters = [
            ("user_id", "user_id", "int"),
            ("lead_id", "lead_id", "str"),
            ("deal_id", "deal_id", "int"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("project_id", "project_id", "int"),
            ("task_id", "task_id", "int"),
        ]
        for flag in ("lead", "deal", "organization", "person", "project", "task"):
            filters.append((f"pinned_to_{flag}_flag", f"pinned_to_{flag}_flag", "bool"))
        pred_fields = self._filter_pred(ListSpec("notes", filters=tuple(filters)), q)
        start_date, end_date = q.get("start_date"), q.get("end_date")
        for name, value in (("start_date", start_date), ("end_date", end_date)):
            if value is not None and not re.match(r"^\d{4}-\d{2}-\d{2}$", value):
                raise ApiError(400, f"Parameter '{name}' must be a date YYYY-MM-DD")
        pred = pred_fields
        if start_date or end_date:

            def pred(rec: dict[str, Any], _base: Any = pred_fields) -> bool:
                when = str(rec.get("add_time", ""))[:10]
                if start_date and when < start_date:
                    return False
                if end_date and when > end_date:
                    return False
                return _base is None or _base(rec)

        if self.state.live.touches("notes") and not self.state.shapes.touches("notes"):
            candidates: Iterable[int] = self._live_order("notes", "all", since, None, "id", desc, None)
        elif self.state.live.touches("notes"):
            candidates = [i for _, i in self._shaped_order("notes", "all", since, None, "id", desc)]
        else:
            candidates = self._candidates("notes", "all", lo, hi, desc)
        rows, start, limit, more, _ = self._v1_page("notes", candidates, q, pred, sort)
        return {"success": True, "data": rows, "additional_data": _v1_additional(start, limit, more, len(rows))}

    def v1_users(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/users`, in id order."""
        rows, start, limit, more, _ = self._v1_page("users", range(self.ds.count("users")), q, None, None)
        return {"success": True, "data": rows, "additional_data": _v1_additional(start, limit, more, len(rows))}

    def v1_me(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """The token's user (the first, the account's admin) with its company: one sandbox, one company."""
        return {"success": True, "data": {**self.ds.record("users", 0), **self.ds.company()}}

    def v1_single(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /v1/{leads|notes|users}/{id}`: one row as served now (a lead's id is its uuid);
        ApiError 400 for a non-integer id, 404 when there is none."""
        kind = endpoint.spec_path.split("/")[1]
        ident: Any = params["id"]
        if kind != "leads":
            try:
                ident = int(ident)
            except ValueError:
                raise ApiError(400, "Parameter 'id' must be an integer") from None
        index = self.state.live.index_of(kind, ident)
        if index is None:
            raise ApiError(404, f"{SINGULAR[kind]} not found" if kind != "leads" else "requested lead not found")
        return {"success": True, "data": self._record(kind, index)}

    def v1_fields(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of a v1 field list (`/v1/leadFields`, `/v1/noteFields`, `/v1/dealFields`, ...),
        offset-paginated."""
        if endpoint.spec_path == "/leadFields":
            items = v1_lead_fields(self.ds)
        elif endpoint.spec_path == "/noteFields":
            items = v1_note_fields(self.ds)
        else:
            items = v1_entity_fields(self.ds, ENTITY_OF_V1_FIELDS[endpoint.spec_path.strip("/")])
        items = self.state.live.field_items(items)
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        size = self.state.shapes.cap(limit)
        page = items[start : start + size]
        more = start + size < len(items)
        return {"success": True, "data": page, "additional_data": _v1_additional(start, limit, more, len(page), flat=True)}

    def v1_deals_summary(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`/v1/deals/summary[/archived]`: count and values of the active (archived) deals as served
        now, optionally filtered by status, user_id, pipeline_id, stage_id."""
        archived = endpoint.spec_path.endswith("/archived")
        if q.get("filter_id") is not None:
            raise ApiError(404, "Filter not found")
        status = q.get("status")
        if status is not None and status not in ("open", "won", "lost"):
            raise ApiError(400, "Parameter 'status' must be one of: open, won, lost")
        user_id, pipeline_id, stage_id = q.int("user_id"), q.int("pipeline_id"), q.int("stage_id")
        shapes = self.state.shapes
        live = self.state.live
        key = (archived, status, user_id, pipeline_id, stage_id, tuple(sorted(shapes.flipped["deals"])))
        if self.state.summary_version != live.version:
            self.state.summary_cache.clear()
            self.state.summary_version = live.version
        cached = self.state.summary_cache.get(key)
        if cached is not None:
            return {"success": True, "data": cached}
        ds = self.ds
        stage_probability = {ds.record("stages", s)["id"]: ds.record("stages", s)["deal_probability"] for s in range(ds.count("stages"))}

        def count(totals: dict[str, list[float]], rec: dict[str, Any], sign: int) -> None:
            if status is not None and rec["status"] != status:
                return
            if user_id is not None and rec["owner_id"] != user_id:
                return
            if pipeline_id is not None and rec["pipeline_id"] != pipeline_id:
                return
            if stage_id is not None and rec["stage_id"] != stage_id:
                return
            t = totals.setdefault(rec["currency"], [0.0, 0, 0.0])  # currency -> [value, count, weighted]
            t[0] += sign * rec["value"]
            t[1] += sign
            t[2] += sign * rec["value"] * stage_probability.get(rec["stage_id"], 100) / 100.0

        base = self.state.summary_base.get(key)
        if base is None:
            base = {}
            for i in range(ds.count("deals")):
                if shapes.is_archived("deals", i) == archived:
                    count(base, ds.record("deals", i), 1)  # never the malformed copy: the source's own count
            self.state.summary_base[key] = base
        totals = {currency: list(t) for currency, t in base.items()}
        # Live changes: take the deals they touched out as generated, put them back as they are now
        # (values are multiples of 250 and probabilities of 20%: the float sums stay exact).
        for i in live.touched("deals"):
            if i < ds.count("deals") and shapes.is_archived("deals", i) == archived:
                count(totals, ds.record("deals", i), -1)
            if live.exists("deals", i) and live.is_archived("deals", i) == archived:
                count(totals, live.record("deals", i), 1)
        data = _deals_summary({currency: t for currency, t in totals.items() if t[1]})
        self.state.summary_cache[key] = data
        return {"success": True, "data": data}

    def v1_deal_mail(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/deals/{id}/mailMessages`: the deal's messages without body, offset-paginated;
        ApiError 400 for a non-integer id, 404 for a deal that is not there."""
        try:
            deal_id = int(params["id"])
        except ValueError:
            raise ApiError(400, "Parameter 'id' must be an integer") from None
        d = self.state.live.index_of("deals", deal_id)
        if d is None:
            raise ApiError(404, "Deal not found")
        if d in self.state.shapes.private_deals:
            # the token reads the account, but this deal's mail is private to another user
            raise ApiError(403, "You do not have permission to see the mail of this deal")
        ids = self.state.live.deal_message_ids(d)
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        size = self.state.shapes.cap(limit)
        chunk = ids[start : start + size]
        more = start + size < len(ids)
        data = [self._mail_item(mid) for mid in chunk]
        return {"success": True, "data": data, "additional_data": _v1_additional(start, limit, more, len(data), flat=True)}

    def v1_mail_message(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`/v1/mailbox/mailMessages/{id}`: one message, with `data.body` when `include_body=1`.

        The mail service's envelope (`statusCode`, `statusText`, `service`). A message private to
        another user (the `private_mail` shape) answers 403 or 404 for its body; ApiError 404 for an
        unknown id."""
        try:
            mid = int(params["id"])
        except ValueError:
            raise ApiError(400, "Parameter 'id' must be an integer") from None
        shapes = self.state.shapes
        include_body = q.get("include_body") in ("1", "true")
        index = self.ds.index_of("mail_messages", mid)
        live_data = self.state.live.mail_data(mid) if index is None else None
        if live_data is not None:  # a message a live change added
            data = live_data
            if include_body:
                data["body"] = self.state.live.mail_body(mid)
        elif index is None:
            if shapes.hostile_of(mid) is None:
                raise ApiError(404, "Mail message not found")
            data = shapes.hostile_record(mid)
            if include_body:
                data["body"] = shapes.hostile_body(mid)
        else:
            private = shapes.private.get(mid)
            if include_body and private is not None:
                # A message private to another user: listed on the deal, its body is not ours to read.
                raise ApiError(private, "You do not have permission to read this mail message" if private == 403 else "Mail message not found")
            data = dict(self.ds.record("mail_messages", index, self.state.badrow))
            if include_body:
                data["body"] = self.ds.mail_body(mid, self.state.badrow)
        return {"success": True, "statusCode": 2000, "statusText": "Success", "service": "email-api", "data": data}


CURRENCY_SYMBOL = {"EUR": "€", "USD": "US$", "GBP": "£", "SEK": "SEK "}
EUR_PER_UNIT = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "SEK": 0.087}  # fixed rates: the company currency is EUR


def _money(currency: str, value: float) -> str:
    return f"{CURRENCY_SYMBOL.get(currency, currency + ' ')}{value:,.2f}"


def _deals_summary(totals: dict[str, list[float]]) -> dict[str, Any]:
    """The deals summary `data` from per-currency [value, count, weighted value]."""
    values: dict[str, Any] = {}
    weighted: dict[str, Any] = {}
    converted = weighted_converted = 0.0
    count = 0
    for currency in sorted(totals):
        value, n, w = totals[currency]
        rate = EUR_PER_UNIT.get(currency, 1.0)
        values[currency] = {
            "value": round(value, 2),
            "count": int(n),
            "value_converted": round(value * rate, 2),
            "value_formatted": _money(currency, value),
            "value_converted_formatted": _money("EUR", value * rate),
        }
        weighted[currency] = {"value": round(w, 2), "count": int(n), "value_formatted": _money(currency, w)}
        converted += value * rate
        weighted_converted += w * rate
        count += int(n)
    return {
        "values_total": values,
        "weighted_values_total": weighted,
        "total_count": count,
        "total_currency_converted_value": round(converted, 2),
        "total_weighted_currency_converted_value": round(weighted_converted, 2),
        "total_currency_converted_value_formatted": _money("EUR", converted),
        "total_weighted_currency_converted_value_formatted": _money("EUR", weighted_converted),
    }


def _v1_additional(start: int, limit: int, more: bool, returned: int, flat: bool = False) -> dict[str, Any]:
    pagination: dict[str, Any] = {"start": start, "limit": limit, "more_items_in_collection": more}
    if more:
        pagination["next_start"] = start + returned
    out: dict[str, Any] = {"pagination": pagination}
    if flat:
        # Some v1 schemas (leads, lead/note fields, a deal's mail) document these at the top level.
        out.update({"start": start, "limit": limit, "more_items_in_collection": more})
    return out
