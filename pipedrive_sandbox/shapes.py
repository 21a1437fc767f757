"""API shapes the real Pipedrive sends, layered over the generated account.

The `Dataset` stays pure (it is shared between servers of one process); everything a shape changes
lives here, per server, and is rebuilt whenever the shape options change at run time. With every
shape off, `Shapes.active` is False and the application serves the generated account unchanged.

* `page_cap` - `cap(limit)`: at most that many rows a page whatever `limit` asks.
* `empty_pages` - the application answers a v2 list's first page with `data: []` and a
  `START_CURSOR` (see `is_start_cursor`).
* `null_update_time` - `null_idx[kind]`: rows served with `update_time: null`
  (`update_ts()` answers None for them).
* `archive_flip` - `flip_candidates[kind]`: active deals/leads that move to the archived list once
  an active-list page has served them (`served_active`); `flipped[kind]` = {index: flip time}.
  Flip times are deterministic: one hour after the kind's latest update time, plus one second per
  flip already made in that kind, so they are later than every other row.
* `hostile_mail` - four extra message ids after the account's last one, on deals that have mail:
  variants `huge` (1,200,000+ character HTML body with an inline base64 image), `nul` (one NUL in
  the body), `lone_surrogate` (subject and snippet end in U+D800, sent as the `\\ud800` escape) and
  `invalid_utf8` (the body's bytes on the wire contain 0xff 0xfe: the application replaces
  `INVALID_UTF8_MARK` after encoding).
* `private_mail` - messages whose body fetch (`include_body=1`) answers 403 (even id) or 404 (odd).
* `forbidden_fanout` - N deals, N persons and N organizations private to another user: listed and
  served by GET as usual, but their per-row lists (a deal's products, participants, flow and
  changelog; followers) answer 403, and `/api/v2/deals/products` leaves their lines out.
* `private_deal_mail` - deals with mail whose mail listing (`/v1/deals/{id}/mailMessages`) answers
  403: the token reads the account, but that deal's mail is private to another user.
* `long_notes` - notes served with a content of LONG_NOTE_CHARS+ characters (HTML with an inline
  base64 image; Pipedrive allowed notes of about 3,000,000 characters for years).
"""
from __future__ import annotations

import base64
import random
from typing import Any, Sequence

from .config import SandboxConfig
from .envelope import ApiError
from .clock import iso_ms, rfc3339, v1_time
from .data import Dataset
from .hashing import mix
from .kinds import KIND_CODE, index_to_id

NULL_TIME_KINDS: tuple[str, ...] = ("organizations", "persons", "deals", "activities", "notes", "leads")
FLIP_KINDS: tuple[str, ...] = ("deals", "leads")
HOSTILE_VARIANTS: tuple[str, ...] = ("huge", "nul", "lone_surrogate", "invalid_utf8")
HUGE_BODY_MIN_CHARS = 1_200_000
# Private-use characters no generated text contains; replaced by the raw bytes 0xff 0xfe on the wire.
INVALID_UTF8_MARK = "\ue000\ue001invalid\ue001\ue000"
INVALID_UTF8_MARK_BYTES = INVALID_UTF8_MARK.encode("utf-8")
INVALID_UTF8_BYTES = b"\xff\xfe"
LONE_SURROGATE = "\ud800"
SHAPE_TRUTH_KINDS: tuple[str, ...] = ("null_update_time", "archive_flipped", "archive_flip_candidates", "hostile_mail", "private_mail",
                                      "forbidden_fanout", "private_deal_mail", "long_notes")
FANOUT_KINDS: tuple[str, ...] = ("deals", "persons", "organizations")
LONG_NOTE_CHARS = 1_500_000

S_SHAPE = 40  # hash stream of the shapes, independent of the data's streams


def _time_text(kind: str, ts: int) -> str:
    """A time in the format the kind's API serves (`update_time`)."""
    if kind == "notes":
        return v1_time(ts)
    if kind == "leads":
        return iso_ms(ts)
    return rfc3339(ts)


class Shapes:
    """The shape state of one server (see the module docstring)."""

    def __init__(self, ds: Dataset, config: SandboxConfig) -> None:
        self.ds = ds
        self.page_cap = config.page_cap
        self.empty_pages = config.empty_pages
        self.hostile_on = config.hostile_mail
        self.active = any(getattr(config, name) for name in SandboxConfig.SHAPES)
        self.null_idx: dict[str, frozenset[int]] = {}
        self.flip_candidates: dict[str, tuple[int, ...]] = {k: () for k in FLIP_KINDS}
        self.flipped: dict[str, dict[int, int]] = {k: {} for k in FLIP_KINDS}
        self._flip_set: dict[str, frozenset[int]] = {k: frozenset() for k in FLIP_KINDS}
        self.hostile: list[tuple[int, int, str]] = []  # (message id, deal index, variant)
        self.extra_by_deal: dict[int, list[int]] = {}
        self.private: dict[int, int] = {}  # message id -> 403 | 404
        self.private_deals: frozenset[int] = frozenset()  # deal indexes whose mail listing answers 403
        self.long_notes: frozenset[int] = frozenset()  # note indexes served with a long content
        self._huge_body: str | None = None
        self.forbidden: dict[str, frozenset[int]] = {}
        if config.forbidden_fanout:
            self.forbidden = {k: frozenset(self._sample(k, config.forbidden_fanout, lambda i: True, 7)) for k in FANOUT_KINDS}
        self._long_note: str | None = None
        if config.null_update_time:
            self._pick_null_times(config.null_update_time)
        if config.archive_flip:
            self._pick_flips(config.archive_flip)
        if config.hostile_mail:
            self._pick_hostile()
        if config.private_mail:
            self._pick_private(config.private_mail)
        if config.private_deal_mail:
            hosts = sorted(ds.mail_deal_index)
            self._rng(KIND_CODE["deals"], 10).shuffle(hosts)
            self.private_deals = frozenset(hosts[: config.private_deal_mail])
        if config.long_notes:
            self.long_notes = frozenset(self._sample("notes", config.long_notes, lambda i: True, 8))

    # ------------------------------------------------------------------ choosing rows
    def _rng(self, *parts: int) -> random.Random:
        return random.Random(mix(self.ds.seed, S_SHAPE, *parts))

    def _sample(self, kind: str, n: int, ok: Any, salt: int) -> list[int]:
        """Up to n distinct indexes of `kind` passing ok(index), in a seed-determined order."""
        total = self.ds.count(kind)
        if total == 0 or n <= 0:
            return []
        rng = self._rng(KIND_CODE[kind], salt)
        if total <= 4 * n + 64:
            order = list(range(total))
            rng.shuffle(order)
            return [i for i in order if ok(i)][:n]
        chosen: list[int] = []
        seen: set[int] = set()
        for _ in range(50 * n + 1000):
            i = rng.randrange(total)
            if i in seen:
                continue
            seen.add(i)
            if ok(i):
                chosen.append(i)
                if len(chosen) == n:
                    break
        return chosen

    def _pick_null_times(self, n: int) -> None:
        ds = self.ds
        for kind in NULL_TIME_KINDS:
            # Active deals and leads, so the default list serves them.
            picked = self._sample(kind, n, lambda i, k=kind: not ds.is_archived(k, i), 1)
            self.null_idx[kind] = frozenset(picked)

    def _pick_flips(self, n: int) -> None:
        ds = self.ds
        for kind in FLIP_KINDS:
            nulls = self.null_idx.get(kind, frozenset())

            def ok(i: int, k: str = kind, nulls: frozenset[int] = nulls) -> bool:
                return not ds.is_archived(k, i) and i not in nulls

            picked: list[int] = []
            if kind == "deals":
                # Deals with mail first: their emails must follow the deal to its one row.
                with_mail = [d for d in ds.mail_deal_index if ok(d)]
                self._rng(KIND_CODE[kind], 2).shuffle(with_mail)
                picked = with_mail[:n]
            if len(picked) < n:
                taken = set(picked)
                picked += self._sample(kind, n - len(picked), lambda i: ok(i) and i not in taken, 3)
            self.flip_candidates[kind] = tuple(sorted(picked))
            self._flip_set[kind] = frozenset(picked)

    def _pick_hostile(self) -> None:
        ds = self.ds
        hosts = list(ds.mail_deal_index)
        if not hosts:
            return
        self._rng(KIND_CODE["mail_messages"], 4).shuffle(hosts)
        for n, variant in enumerate(HOSTILE_VARIANTS):
            mid = ds.message_total + 1 + n
            deal = hosts[n % len(hosts)]
            self.hostile.append((mid, deal, variant))
            self.extra_by_deal.setdefault(deal, []).append(mid)

    def _pick_private(self, n: int) -> None:
        total = self.ds.message_total
        if total == 0:
            return
        ids = list(range(1, total + 1))
        self._rng(KIND_CODE["mail_messages"], 5).shuffle(ids)
        want_even = (n + 1) // 2
        evens = [m for m in ids if m % 2 == 0][:want_even]
        odds = [m for m in ids if m % 2 == 1][: n - len(evens)]
        chosen = evens + odds
        if len(chosen) < n:  # too few of one parity: fill with the other
            rest = [m for m in ids if m not in set(chosen)]
            chosen += rest[: n - len(chosen)]
        self.private = {m: (403 if m % 2 == 0 else 404) for m in sorted(chosen)}

    def fanout_forbidden(self, kind: str, index: int) -> bool:
        """Whether the row's per-row lists answer 403 (the forbidden_fanout shape)."""
        found = self.forbidden.get(kind)
        return bool(found) and index in found

    def check_fanout(self, kind: str, index: int) -> None:
        """Raise ApiError 403 when the row's per-row lists are forbidden (the forbidden_fanout shape)."""
        if self.fanout_forbidden(kind, index):
            raise ApiError(403, "You do not have permission to access this item")

    # ------------------------------------------------------------------ listing and records
    def cap(self, limit: int) -> int:
        """Rows a page serves when `limit` is asked."""
        return min(limit, self.page_cap) if self.page_cap else limit

    def touches(self, kind: str) -> bool:
        """True when some row of `kind` has a time or a list membership the generator does not say."""
        return bool(self.null_idx.get(kind)) or bool(self.flipped.get(kind))

    def update_ts(self, kind: str, index: int) -> int | None:
        """The row's update time as served (None = `update_time: null`)."""
        flipped = self.flipped.get(kind)
        if flipped and index in flipped:
            return flipped[index]
        nulls = self.null_idx.get(kind)
        if nulls and index in nulls:
            return None
        return self.ds.update_ts(kind, index)

    def is_archived(self, kind: str, index: int) -> bool:
        """Whether the generated deal or lead at `index` is archived now (generated, or flipped once served)."""
        flipped = self.flipped.get(kind)
        return self.ds.is_archived(kind, index) or bool(flipped and index in flipped)

    def apply(self, kind: str, index: int, rec: dict[str, Any]) -> dict[str, Any]:
        """The record as served now (the same object when no shape touches the row)."""
        flipped = self.flipped.get(kind)
        if flipped and index in flipped:
            ts = flipped[index]
            out = dict(rec)
            out["is_archived"] = True
            out["update_time"] = _time_text(kind, ts)
            if kind == "deals":
                out["archive_time"] = rfc3339(ts)
            return out
        nulls = self.null_idx.get(kind)
        if nulls and index in nulls:
            out = dict(rec)
            out["update_time"] = None
            return out
        if kind == "notes" and index in self.long_notes and isinstance(rec.get("content"), str):
            return {**rec, "content": self.long_note(rec["content"])}
        return rec

    def long_note(self, content: str) -> str:
        """A note's content made long: its own text, then an inline base64 image of LONG_NOTE_CHARS."""
        if self._long_note is None:
            raw = self._rng(KIND_CODE["notes"], 9).randbytes(LONG_NOTE_CHARS * 3 // 4)
            self._long_note = f'<p>Chart:</p><img alt="chart" src="data:image/png;base64,{base64.b64encode(raw).decode("ascii")}"/>'
        return content + self._long_note

    def served_active(self, kind: str, indexes: Sequence[int]) -> None:
        """An active-list page has just served these rows: flip the candidates among them."""
        candidates = self._flip_set.get(kind)
        if not candidates:
            return
        flipped = self.flipped[kind]
        base = self.ds.update_ts(kind, self.ds.count(kind) - 1) + 3600
        for i in indexes:
            if i in candidates and i not in flipped:
                flipped[i] = base + len(flipped)

    # ------------------------------------------------------------------ mail
    def message_total(self) -> int:
        """The number of messages served: generated plus the hostile_mail ones."""
        return self.ds.message_total + len(self.hostile)

    def deal_message_ids(self, deal_index: int) -> Sequence[int]:
        """The message ids listed under the deal at `deal_index`: generated, then the hostile ones."""
        base = self.ds.deal_message_ids(deal_index)
        extra = self.extra_by_deal.get(deal_index)
        return list(base) + extra if extra else base

    def hostile_of(self, mid: int) -> tuple[int, str] | None:
        """(deal index, variant) of a hostile message id, else None."""
        n = mid - self.ds.message_total - 1
        if 0 <= n < len(self.hostile):
            _, deal, variant = self.hostile[n]
            return deal, variant
        return None

    def hostile_record(self, mid: int) -> dict[str, Any]:
        """The message's `data` (no body): a copy of its deal's first message with its own identity."""
        found = self.hostile_of(mid)
        assert found is not None
        deal, variant = found
        first = self.ds.deal_message_ids(deal)[0]
        rec = dict(self.ds.record("mail_messages", first - 1))
        subject = {
            "huge": "Quarterly report (inline chart)",
            "nul": "Invoice attached",
            "lone_surrogate": "Emoji cut in half " + LONE_SURROGATE,
            "invalid_utf8": "Price list (legacy encoding)",
        }[variant]
        prefix = rec["body_url"].rsplit("/mailMessages/", 1)[0]
        rec.update(
            id=mid,
            subject=subject,
            snippet=("Hello, see the chart below" if variant != "lone_surrogate" else "Thanks! " + LONE_SURROGATE),
            body_url=f"{prefix}/mailMessages/{mid}/body",
            nylas_id=f"{mix(self.ds.seed, mid):016x}",
            s3_bucket_path=f"sandbox/{rec['user_id']}/nylas/{mid}/body",
            mua_message_id=f"{mix(self.ds.seed, mid, 2):016x}@mailer.example",
        )
        return rec

    def hostile_list_item(self, mid: int) -> dict[str, Any]:
        """Hostile message `mid` as a deal's mail list item (`object`, `timestamp`, `data`)."""
        data = self.hostile_record(mid)
        return {"object": "mailMessage", "timestamp": data["timestamp"].replace("T", " ")[:19], "data": data}

    def hostile_body(self, mid: int) -> str:
        """The body of hostile message `mid`: huge, with a NUL, with a lone surrogate, or marked invalid UTF-8."""
        found = self.hostile_of(mid)
        assert found is not None
        variant = found[1]
        if variant == "huge":
            if self._huge_body is None:
                raw = self._rng(KIND_CODE["mail_messages"], 6).randbytes(HUGE_BODY_MIN_CHARS * 3 // 4)
                image = base64.b64encode(raw).decode("ascii")
                self._huge_body = (
                    "<html><body><p>Please find the quarterly chart below.</p>"
                    f'<img alt="chart" src="data:image/png;base64,{image}"/>'
                    "<p>Best regards</p></body></html>"
                )
            return self._huge_body
        if variant == "nul":
            return "<p>Invoice attached.</p>\u0000<p>Best regards</p>"
        if variant == "lone_surrogate":
            return "<p>Thanks!</p><p>Best regards</p>"
        return f"<p>Price list: caf{INVALID_UTF8_MARK} au lait 3.50</p><p>Best regards</p>"

    # ------------------------------------------------------------------ truth
    def extend_truth(self, out: dict[str, Any], kind: str | None) -> dict[str, Any]:
        """Make a `Dataset.truth()` answer say what the server serves now; add the shape keys."""
        ds = self.ds
        ids = out.get("ids", {})
        if any(self.flipped.values()):
            for k in FLIP_KINDS:
                flipped = self.flipped[k]
                if not flipped:
                    continue
                if k in ids:
                    ids[k] = [ds.ident(k, i) for i in ds.indexes(k, "active") if i not in flipped]
                if f"{k}_archived" in ids:
                    ids[f"{k}_archived"] = [ds.ident(k, i) for i in sorted(set(ds.indexes(k, "archived")) | set(flipped))]
            counts = out.get("counts")
            if counts is not None:
                for k in FLIP_KINDS:
                    n = len(self.flipped[k])
                    counts[k] -= n
                    counts[f"{k}_archived"] += n
        if self.hostile:
            if "mail_messages" in ids:
                ids["mail_messages"] = ids["mail_messages"] + [mid for mid, _, _ in self.hostile]
            if "deals_with_mail" in out:
                for mid, deal, _ in self.hostile:
                    out["deals_with_mail"][str(index_to_id("deals", deal))].append(mid)
            if out.get("counts") is not None:
                out["counts"]["mail_messages"] = self.message_total()
        if kind is None or kind == "null_update_time":
            out["null_update_time"] = {k: [ds.ident(k, i) for i in sorted(v)] for k, v in self.null_idx.items()}
        if kind is None or kind == "archive_flipped":
            out["archive_flipped"] = {k: [ds.ident(k, i) for i in sorted(self.flipped[k])] for k in FLIP_KINDS}
        if kind is None or kind == "archive_flip_candidates":
            out["archive_flip_candidates"] = {k: [ds.ident(k, i) for i in self.flip_candidates[k]] for k in FLIP_KINDS}
        if kind is None or kind == "hostile_mail":
            out["hostile_mail"] = [{"id": mid, "deal_id": index_to_id("deals", d), "variant": v} for mid, d, v in self.hostile]
        if kind is None or kind == "forbidden_fanout":
            out["forbidden_fanout"] = {k: [ds.ident(k, i) for i in sorted(self.forbidden.get(k, ()))] for k in FANOUT_KINDS}
        if kind is None or kind == "private_deal_mail":
            out["private_deal_mail"] = [
                {"deal_id": index_to_id("deals", d), "messages": list(self.deal_message_ids(d))} for d in sorted(self.private_deals)
            ]
        if kind is None or kind == "long_notes":
            out["long_notes"] = [
                {"id": ds.ident("notes", i), "length": len(self.apply("notes", i, ds.record("notes", i))["content"])}
                for i in sorted(self.long_notes)
            ]
        if kind is None or kind == "private_mail":
            out["private_mail"] = [
                {"id": mid, "deal_id": index_to_id("deals", loc[0]), "status": status}
                for mid, status in self.private.items()
                if (loc := ds.message_location(mid)) is not None
            ]
        return out
