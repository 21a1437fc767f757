"""The `/api/v2/` endpoints: cursor-paginated lists, single records and field definitions."""
from __future__ import annotations

from typing import Any, Iterable

from .catalog import ENTITY_OF_KIND, KIND_OF_V2, MONOTONIC_SORTS, SINGULAR, V2_LISTS, Endpoint
from .clock import parse_time, rfc3339
from .envelope import ApiError
from .fields import ENTITY_OF_V2_FIELDS, v2_fields
from .v2_crm import V2Crm
from .query import Query, decode_cursor, encode_cursor, sort_value
from .shapes import FLIP_KINDS


class V2Api(V2Crm):
    """The `/api/v2/` handlers: persons, organizations, deals (active and archived), activities,
    pipelines, stages, and the four field-definition lists.

    v2 lists page by cursor: `additional_data.next_cursor`, null on the last page (v2 spec, every
    list operation)."""

    def _v2_custom(self, kind: str, rec: dict[str, Any], q: Query) -> dict[str, Any]:
        entity = ENTITY_OF_KIND.get(kind)
        if entity is None or not isinstance(rec.get("custom_fields"), dict):
            return rec
        wanted = q.get("custom_fields")
        labels = q.bool("include_option_labels")
        if wanted is None and not labels:
            return rec
        values = dict(rec["custom_fields"])
        if wanted is not None:
            keys = [k.strip() for k in wanted.split(",") if k.strip()]
            if len(keys) > 15:
                raise ApiError(400, "A maximum of 15 custom field keys is allowed in 'custom_fields'")
            values = {k: v for k, v in values.items() if k in keys}
        if labels:
            by_key = {f.key: f for f in self.ds.custom_fields[entity]}
            for k, v in list(values.items()):
                f = by_key.get(k)
                if f is None or v is None or not f.options:
                    continue
                label_of = {**dict(f.options), **self.state.live.option_labels.get(k, {})}
                if f.field_type == "enum" and isinstance(v, int):
                    values[k] = {"id": v, "label": label_of.get(v)}
                elif f.field_type == "set" and isinstance(v, list):
                    values[k] = [{"id": x, "label": label_of.get(x)} for x in v]
        out = dict(rec)
        out["custom_fields"] = values
        return out

    def _cursor_key(self, kind: str, cursor: dict[str, Any], sort_by: str) -> tuple[Any, ...]:
        index = self.state.live.cursor_index(kind, cursor.get("id"))  # the row may be gone since
        if index is None:
            raise ApiError(400, "Invalid cursor")
        if sort_by != "update_time":
            return (index,)
        value = cursor.get("fieldValue")
        try:
            t = parse_time(value) if isinstance(value, str) else None
        except ValueError:
            raise ApiError(400, "Invalid cursor") from None
        return (t is None, t or 0, index)

    def v2_list(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of a v2 list: `{success, data: [rows], additional_data: {next_cursor}}`.

        Takes the spec's parameters: `limit` (<= 500), `cursor`, `sort_by` and `sort_direction`,
        `updated_since`/`updated_until` (RFC 3339), `ids` (up to 100, unknown ids left out), the
        kind's filters (owner_id, org_id, ...), `custom_fields` (up to 15 keys), `include_option_labels`,
        and for deals `include_fields=email_messages_count`. A `filter_id` answers 404 (the sandbox
        has no saved filters). Raises ApiError 400 for any malformed parameter or foreign cursor."""
        spec = V2_LISTS[endpoint.spec_path]
        ds, kind = self.ds, spec.kind
        shapes = self.state.shapes
        limit = q.limit()
        size = shapes.cap(limit)
        if q.get("filter_id") is not None:
            raise ApiError(404, "Filter not found")
        sort_by = q.get("sort_by") or "id"
        if sort_by not in spec.sorts:
            raise ApiError(400, f"Parameter 'sort_by' must be one of: {', '.join(spec.sorts)}")
        direction = (q.get("sort_direction") or "asc").lower()
        if direction not in ("asc", "desc"):
            raise ApiError(400, "Parameter 'sort_direction' must be one of: asc, desc")
        desc = direction == "desc"
        lo, hi = 0, ds.count(kind)
        since = until = None
        if spec.time_filters:
            since, until = q.time("updated_since"), q.time("updated_until")
            if since is not None:
                lo = ds.first_index_at_or_after(kind, since)
            if until is not None:
                hi = ds.first_index_at_or_after(kind, until)
        pred = self._filter_pred(spec, q)
        ids_param = q.get("ids")
        cursor = decode_cursor(q.get("cursor")) if q.get("cursor") else None
        if cursor is not None and (cursor.get("field") != sort_by or cursor.get("sortDirection") != direction):
            raise ApiError(400, "Invalid cursor: it belongs to another sort order")
        if cursor is not None and cursor.get("start"):
            cursor = None  # the empty_pages shape's cursor: resume at the first row

        wanted_idxs: list[int] | None = None
        if ids_param is not None:
            try:
                wanted = [int(x) for x in ids_param.split(",") if x.strip()]
            except ValueError:
                raise ApiError(400, "Parameter 'ids' must be a comma separated list of integers") from None
            if len(wanted) > 100:
                raise ApiError(400, "Parameter 'ids' accepts at most 100 ids")
            wanted_idxs = sorted({i for i in (self.state.live.index_of(kind, w) for w in wanted) if i is not None})

        if shapes.empty_pages and q.get("cursor") is None:
            # A first page that is empty yet says there is more, as Pipedrive sometimes answers.
            start = encode_cursor({"field": sort_by, "fieldValue": None, "sortDirection": direction, "id": None, "start": True})
            return {"success": True, "data": [], "additional_data": {"next_cursor": start}}

        shaped = self.state.live.touches(kind) and sort_by in MONOTONIC_SORTS
        if shaped and wanted_idxs is None and not shapes.touches(kind):
            # Only live changes touch the kind: lazily, without materialising its rows.
            ck = self._cursor_key(kind, cursor, sort_by) if cursor is not None else None
            candidates: Iterable[int] = self._live_order(kind, spec.subset, since, until, sort_by, desc, ck)
        elif shaped:
            ordered = self._shaped_order(kind, spec.subset, since, until, sort_by, desc, wanted_idxs)
            if cursor is not None:
                ck = self._cursor_key(kind, cursor, sort_by)
                ordered = [r for r in ordered if (r[0] < ck if desc else r[0] > ck)]
            candidates = [i for _, i in ordered]
        elif wanted_idxs is not None:
            idxs = [i for i in wanted_idxs if lo <= i < hi]
            if spec.subset != "all":
                idxs = [i for i in idxs if ds.is_archived(kind, i) == (spec.subset == "archived")]
            candidates = reversed(idxs) if desc else idxs
        else:
            candidates = self._candidates(kind, spec.subset, lo, hi, desc)

        if sort_by in MONOTONIC_SORTS:
            if cursor is not None and not shaped:
                after = ds.index_of(kind, cursor["id"])
                if after is None:
                    raise ApiError(400, "Invalid cursor")
                candidates = (i for i in candidates if (i < after if desc else i > after))
            page: list[tuple[int, dict[str, Any]]] = []
            for i in candidates:
                rec = self._record(kind, i)
                if pred is not None and not pred(rec):
                    continue
                page.append((i, rec))
                if len(page) > size:
                    break
        else:
            # Keyset over a field that does not follow the index (stages by order_nr): materialise.
            rows = [(i, self._record(kind, i)) for i in candidates]
            rows = [r for r in rows if pred is None or pred(r[1])]
            rows.sort(key=lambda r: (sort_value(r[1].get(sort_by)), r[0]), reverse=desc)
            if cursor is not None:
                after_key = (sort_value(cursor.get("fieldValue")), ds.index_of(kind, cursor["id"]) or 0)
                rows = [r for r in rows if ((sort_value(r[1].get(sort_by)), r[0]) < after_key if desc else (sort_value(r[1].get(sort_by)), r[0]) > after_key)]
            page = rows[: size + 1]
        more = len(page) > size
        page = page[:size]
        next_cursor = None
        if more and page:
            last_i, last_rec = page[-1]
            next_cursor = encode_cursor(
                {"field": sort_by, "fieldValue": self._sort_field_value(kind, last_i, last_rec, sort_by), "sortDirection": direction, "id": ds.ident(kind, last_i)}
            )
        data = [self._v2_custom(kind, rec, q) for _, rec in page]
        included = {f.strip() for f in (q.get("include_fields") or "").split(",") if f.strip()}
        if kind == "deals" and "email_messages_count" in included:
            # The one include_fields value a full export needs: which deals have mail to list.
            data = [
                {**row, "email_messages_count": len(self.state.live.deal_message_ids(i))} if isinstance(row, dict) else row
                for (i, _), row in zip(page, data)
            ]  # copies: records may be shared with the generator's cache
        if spec.subset == "active" and kind in FLIP_KINDS:
            shapes.served_active(kind, [i for i, _ in page])  # archive_flip: archived right after being served
        return {"success": True, "data": data, "additional_data": {"next_cursor": next_cursor}}

    def _sort_field_value(self, kind: str, index: int, rec: dict[str, Any], sort_by: str) -> Any:
        if sort_by == "id":
            return self.ds.ident(kind, index)
        if sort_by == "update_time":
            t = self.state.live.update_ts(kind, index)
            return rfc3339(t) if t is not None else None
        if sort_by == "add_time":
            return self.state.live.add_ts_text(kind, index)
        return rec.get(sort_by)

    def v2_single(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /api/v2/{kind}/{id}`: one row as served now; ApiError 400 for a non-integer id, 404 when gone."""
        kind = KIND_OF_V2[endpoint.spec_path.split("/")[1]]
        try:
            ident = int(params["id"])
        except ValueError:
            raise ApiError(400, "Parameter 'id' must be an integer") from None
        index = self.state.live.index_of(kind, ident)
        if index is None:
            raise ApiError(404, f"{SINGULAR[kind]} not found")
        rec = self._record(kind, index)
        return {"success": True, "data": self._v2_custom(kind, rec, q)}

    def v2_fields(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of a v2 field-definition list (`/api/v2/personFields`, ...), cursor-paginated
        like the row lists, in field order."""
        entity = ENTITY_OF_V2_FIELDS[endpoint.spec_path.strip("/")]
        items = self.state.live.field_items(v2_fields(self.ds, entity))
        limit = self.state.shapes.cap(q.limit())
        start = 0
        if q.get("cursor"):
            cur = decode_cursor(q.get("cursor") or "")
            try:
                start = 0 if cur.get("start") else int(cur["id"]) + 1
            except (TypeError, ValueError):
                raise ApiError(400, "Invalid cursor") from None
        elif self.state.shapes.empty_pages:
            first = encode_cursor({"field": "order", "fieldValue": None, "sortDirection": "asc", "id": None, "start": True})
            return {"success": True, "data": [], "additional_data": {"next_cursor": first}}
        page = items[start : start + limit]
        more = start + limit < len(items)
        next_cursor = encode_cursor({"field": "order", "fieldValue": start + limit - 1, "sortDirection": "asc", "id": start + limit - 1}) if more else None
        return {"success": True, "data": page, "additional_data": {"next_cursor": next_cursor}}

    def v2_field(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /api/v2/{entity}Fields/{field_code}`: one field definition; ApiError 404 when unknown."""
        entity = ENTITY_OF_V2_FIELDS[endpoint.spec_path.strip("/").split("/")[0]]
        for item in self.state.live.field_items(v2_fields(self.ds, entity)):
            if item["field_code"] == params["field_code"]:
                return {"success": True, "data": item}
        raise ApiError(404, "Field not found")
