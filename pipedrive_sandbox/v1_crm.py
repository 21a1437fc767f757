"""The `/v1/` endpoints of the CRM's further families: files (metadata and bytes), deal participants
and deal history (`flow` and `changelog`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from .catalog import Endpoint
from .clock import parse_time
from .envelope import ApiError
from .listing import Lister
from .query import Query
from .v2_crm import keyset_page, parse_id

FILES_LIMIT_MAX = 100  # the spec's `limit` of /v1/files: "a maximum value of 100 is allowed"
FLOW_ITEMS = ("dealChange", "change")  # the `items` filter values whose entries the flow serves


@dataclass(frozen=True)
class Download:
    """A file's bytes to stream (`application/octet-stream`): `size` bytes from `chunks`."""

    size: int
    chunks: Iterator[bytes]
    file_name: str


class V1Crm(Lister):
    """Handlers of `V1Api` (mixed into it): files, a deal's participants, its flow and its changelog.

    Offset lists answer `additional_data.pagination` and, where the schema documents them there,
    `start`/`limit`/`more_items_in_collection` at the top of `additional_data` too."""

    def _offset(self, q: Query, limit_max: int | None = None) -> tuple[int, int, int]:
        """(start, limit asked, rows a page serves); ApiError 400 for a limit above `limit_max`."""
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        if limit_max is not None and limit > limit_max:
            raise ApiError(400, f"Parameter 'limit' must not be greater than {limit_max}")
        return start, limit, self.state.shapes.cap(limit)

    def _pagination(self, start: int, limit: int, more: bool, returned: int, flat: bool) -> dict[str, Any]:
        pagination: dict[str, Any] = {"start": start, "limit": limit, "more_items_in_collection": more}
        if more:
            pagination["next_start"] = start + returned
        out: dict[str, Any] = {"pagination": pagination}
        if flat:
            out.update({"start": start, "limit": limit, "more_items_in_collection": more})
        return out

    def _file_index(self, raw: str) -> int:
        index = self.state.live.file_index(parse_id(raw))
        if index is None:
            raise ApiError(404, "File not found")
        return index

    def v1_files(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/files`: every file's metadata, by id (or `sort=id|update_time ASC|DESC`);
        `limit` at most 100 (ApiError 400 above, as the spec caps it)."""
        start, limit, size = self._offset(q, FILES_LIMIT_MAX)
        live = self.state.live
        order = list(range(self.ds.count("files")))
        raw = q.get("sort")
        if raw is not None:
            words = raw.split(",")[0].split()
            field = words[0] if words else ""
            desc = len(words) > 1 and words[1].upper() == "DESC"
            if field not in ("id", "update_time") or (len(words) > 1 and words[1].upper() not in ("ASC", "DESC")):
                raise ApiError(400, "Parameter 'sort' supports: id, update_time (ASC or DESC)")
            if field == "update_time":
                order.sort(key=lambda i: (live.file_update_ts(i), i))
            if desc:
                order.reverse()
        chunk = order[start : start + size]
        more = start + size < len(order)
        data = [live.file_record(i) for i in chunk]
        return {"success": True, "data": data, "additional_data": self._pagination(start, limit, more, len(data), False)}

    def v1_file(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /v1/files/{id}`: one file's metadata; ApiError 404 for an unknown id."""
        return {"success": True, "data": self.state.live.file_record(self._file_index(params["id"]))}

    def v1_file_download(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> Download:
        """`GET /v1/files/{id}/download`: the file's bytes (`file_size` of them, streamed). A file
        private to another user answers 403, one purged from storage 404 (its metadata stays listed)."""
        index = self._file_index(params["id"])
        status = self.ds.file_access(index)
        if status == 403:
            raise ApiError(403, "You do not have permission to download this file")
        if status == 404:
            raise ApiError(404, "File not found in storage")
        version, size = self.state.live.file_version(index), self.state.live.file_record(index)["file_size"]
        return Download(size, self.ds.file_chunks(index, version, size), self.state.live.file_record(index)["file_name"])

    def v1_participants(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/deals/{id}/participants` (offset) with `related_objects` (the persons,
        their organizations and the users the page names). ApiError 404 for a deal not there now,
        403 for a private one."""
        d = self._v1_deal(params["id"])
        rows = self.state.live.participants(d)
        start, limit, size = self._offset(q)
        page = rows[start : start + size]
        more = start + size < len(rows)
        return {
            "success": True,
            "data": page,
            "additional_data": self._pagination(start, limit, more, len(page), True),
            "related_objects": self.state.live.participant_related(page),
        }

    def _v1_deal(self, raw: str) -> int:
        d = self.state.live.index_of("deals", parse_id(raw))
        if d is None:
            raise ApiError(404, "Deal not found")
        self.state.shapes.check_fanout("deals", d)
        return d

    def v1_deal_flow(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/deals/{id}/flow`, newest first: the deal's field changes as `dealChange`
        entries (`{object, timestamp, data: {id, item_id, user_id, field_key, old_value, new_value,
        log_time, ...}}`). Activities, notes, mail and files are not repeated here (each has its own
        list). `items` without dealChange/change answers no entries; `all_changes` adds nothing
        (custom field changes are not generated). ApiError 404/403 as for participants."""
        d = self._v1_deal(params["id"])
        items = q.get("items")
        changes = self.state.live.deal_history(d)
        if items is not None and not {s.strip() for s in items.split(",")} & set(FLOW_ITEMS):
            changes = []
        start, limit, size = self._offset(q)
        page = changes[start : start + size]
        more = start + size < len(changes)
        deal = self.state.live.record("deals", d)
        data = [
            {
                "object": "dealChange",
                "timestamp": c["time"],
                "data": {
                    "id": c["id"], "item_id": deal["id"], "user_id": c["actor_user_id"], "field_key": c["field_key"],
                    "old_value": c["old_value"], "new_value": c["new_value"], "is_bulk_update_flag": None,
                    "log_time": c["time"], "change_source": c["change_source"],
                    "change_source_user_agent": c["change_source_user_agent"], "additional_data": [],
                },
            }
            for c in page
        ]
        users = {c["actor_user_id"] for c in page}
        related = {
            "deal": {str(deal["id"]): {k: deal.get(k) for k in ("id", "title", "status", "value", "currency", "stage_id", "pipeline_id")}},
            "user": {str(u): self.state.live.user_object(u) for u in sorted(users)},
        }
        return {"success": True, "data": data, "additional_data": self._pagination(start, limit, more, len(data), True), "related_objects": related}

    def v1_deal_changelog(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """One page of `/v1/deals/{id}/changelog`, newest first, by cursor (the spec pages this v1 list
        by `cursor`): `{field_key, old_value, new_value, actor_user_id, time, change_source,
        change_source_user_agent, is_bulk_update_flag}`. The same facts as the flow's dealChange
        entries. ApiError 404/403 as for participants."""
        d = self._v1_deal(params["id"])
        size = self.state.shapes.cap(q.limit())
        changes = self.state.live.deal_history(d)
        page, next_cursor = keyset_page(changes, lambda c: parse_time(c["time"]), lambda c: c["id"], "time", q, size, desc=True)
        data = [{k: v for k, v in c.items() if k != "id"} for c in page]
        return {"success": True, "data": data, "additional_data": {"next_cursor": next_cursor}}
