"""A live account: the sandbox changes its account while it serves.

The `Dataset` stays pure (shared between the servers of one process); every change lives here, per
server, as an overlay keyed by the generator's row index, and `Live` answers for the account as it
is now. The application reads rows, times, list memberships and ids through it (it wraps the
`Shapes`); with no change applied it answers exactly what the generator and the shapes say, so
with the live account off the bytes are those of the account without it.

Determinism: change n (1-based `seq`) draws from `random.Random(mix(seed, S_LIVE, n))` and picks its
op (weighted by `live_mix`), kind and rows from the state the n-1 earlier changes left, so the same
seed and the same n give the same changes and the same account; only the times (`at`,
`update_time`, `add_time`) come from the server's clock: each change's time is max(now, last + 1 s),
strictly after every update_time the account served before (so at rates above 1/s the times run
ahead of the clock by the surplus).

The ops are in changes.py.

Concurrency: every change runs under the server's lock (`SandboxState.lock`), which the request
handlers also hold while they build a response, so a change lands between two requests.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Sequence

from .changes import LIVE_KINDS, Changes
from .live_crm import LiveCrm
from .clock import rfc3339
from .config import LIVE_OPS, SandboxConfig, parse_live_mix
from .data import Dataset
from .hashing import mix
from .kinds import REF_FIELDS, id_to_index
from .shapes import HOSTILE_VARIANTS, Shapes, _time_text

MAX_STEP = 100_000


class Live(Changes, LiveCrm):
    """The live overlay of one server (see the module docstring).

    `shapes` is a callable answering the server's current `Shapes` (rebuilt when shape options
    change); `config` one answering its current `SandboxConfig` (rate, cap and mix are read at
    each change); `lock` the server's lock (an RLock) - public methods that change the account take it.
    """

    def __init__(self, ds: Dataset, shapes: Callable[[], Shapes], config: Callable[[], SandboxConfig], lock: threading.RLock) -> None:
        self.ds = ds
        self._shapes = shapes
        self._config = config
        self.lock = lock
        self.applied = 0  # changes applied so far (= the last seq)
        self.version = 0  # bumps with every change (cache keys)
        self.log: list[dict[str, Any]] = []
        self.extra: dict[str, int] = {k: 0 for k in LIVE_KINDS}  # rows created per kind
        self.gone: dict[str, set[int]] = {k: set() for k in LIVE_KINDS}  # deleted or merged
        self.deleted: dict[str, list[int]] = {k: [] for k in LIVE_KINDS}
        self.merged: dict[str, dict[int, int]] = {"persons": {}, "organizations": {}}  # old index -> survivor index
        self.fields: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in LIVE_KINDS}
        self.ts: dict[str, dict[int, int]] = {k: {} for k in LIVE_KINDS}
        self.archived: dict[str, dict[int, bool]] = {"deals": {}, "leads": {}}
        self.mail: dict[int, tuple[int, dict[str, Any], str]] = {}  # message id -> (deal index, data, body)
        self.mail_by_deal: dict[int, list[int]] = {}
        self.lead_ids: dict[str, int] = {}  # uuid of a created lead -> index
        self.converted: dict[int, int] = {}  # lead index -> the deal index it became
        # field changes, by field key (keys are unique across entities)
        self.field_names: dict[str, str] = {}
        self.option_labels: dict[str, dict[int, str]] = {}
        self.fields_deleted: list[str] = []
        self.first_mail_id = ds.message_total + len(HOSTILE_VARIANTS) + 1
        self.last_ts = self._account_last_ts()
        self._refs: dict[tuple[str, Any], set[tuple[str, int, str]]] | None = None
        self._prebuilt: dict[tuple[str, Any], set[tuple[str, int, str]]] | None = None
        self._prebuild_thread: threading.Thread | None = None
        # Background changes.
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._init_crm()

    @property
    def shapes(self) -> Shapes:
        """The server's current Shapes (rebuilt when a shape option changes)."""
        return self._shapes()

    @property
    def changed(self) -> bool:
        """Whether any change was applied: until then every answer is the generator's and the shapes'."""
        return self.applied > 0

    # ------------------------------------------------------------------ the account as it is now
    def touches(self, kind: str) -> bool:
        """True when rows of `kind` may have times, memberships or ids the generator does not say."""
        return self.shapes.touches(kind) or (self.changed and kind in LIVE_KINDS)

    def size(self, kind: str) -> int:
        """Index space of a kind: generated rows plus created ones."""
        return self.ds.count(kind) + self.extra.get(kind, 0)

    def touched(self, kind: str) -> list[int]:
        """Indexes of `kind` a live change touched (changed, archived, gone or created), sorted."""
        if not self.changed or kind not in LIVE_KINDS:
            return []
        out = set(self.fields[kind]) | set(self.ts[kind]) | self.gone[kind] | set(self.archived.get(kind, {}))
        out.update(range(self.ds.count(kind), self.size(kind)))
        return sorted(out)

    def exists(self, kind: str, index: int) -> bool:
        """Whether the row at `index` of `kind` exists now (created rows count; deleted and merged ones not)."""
        if kind not in LIVE_KINDS:
            return self.ds.exists(kind, index)
        return 0 <= index < self.size(kind) and index not in self.gone[kind]

    def universe(self, kind: str) -> Iterable[int]:
        """Indexes of the rows of `kind` that exist now, in index (= id) order."""
        if not self.changed or kind not in LIVE_KINDS:
            return range(self.ds.count(kind))
        gone = self.gone[kind]
        return [i for i in range(self.size(kind)) if i not in gone] if gone else range(self.size(kind))

    def ident(self, kind: str, index: int) -> Any:
        """The id of the row at `index` (created rows continue the generator's ids)."""
        return self.ds.ident(kind, index)

    def cursor_index(self, kind: str, ident: Any) -> int | None:
        """Index of an id, also when the row is gone since (a cursor resumes after it)."""
        if not self.changed or kind not in LIVE_KINDS:
            return self.ds.index_of(kind, ident)
        if kind == "leads":
            i = self.ds.lead_index(str(ident))
            return i if i is not None else self.lead_ids.get(str(ident))
        try:
            number = int(ident)
        except (TypeError, ValueError):
            return None
        i = id_to_index(kind, number)
        return i if i is not None and 0 <= i < self.size(kind) else None

    def index_of(self, kind: str, ident: Any) -> int | None:
        """Index of a row that exists now (None: never existed, purged, deleted or merged)."""
        if not self.changed or kind not in LIVE_KINDS:
            return self.ds.index_of(kind, ident)
        i = self.cursor_index(kind, ident)
        return None if i is None or i in self.gone[kind] else i

    def update_ts(self, kind: str, index: int) -> int | None:
        """The row's update_time now in epoch seconds, or None (the null_update_time shape): the later of
        the shaped time and the last change's."""
        shaped = self.shapes.update_ts(kind, index) if index < self.ds.count(kind) else None
        own = self.ts.get(kind, {}).get(index) if self.changed else None
        if own is None:
            return shaped
        return own if shaped is None else max(own, shaped)

    def add_ts_text(self, kind: str, index: int) -> str:
        """The row's add_time as served (a created row's own, else the generator's, RFC 3339)."""
        own = self.fields.get(kind, {}).get(index, {}).get("add_time") if self.changed else None
        return own if isinstance(own, str) else rfc3339(self.ds.add_ts(kind, index))

    def is_archived(self, kind: str, index: int) -> bool:
        """Whether the deal or lead at `index` is archived now (a change's word, else the shapes')."""
        own = self.archived.get(kind, {}).get(index) if self.changed else None
        if own is not None:
            return own
        return self.shapes.is_archived(kind, index) if index < self.ds.count(kind) else False

    def record(self, kind: str, index: int, badrow: float = 0.0) -> dict[str, Any]:
        """The row as served now (generated, malformed when drawn, shaped, then changed)."""
        ds = self.ds
        if index >= ds.count(kind):  # a created row: never malformed, no shape touches it
            return self._without_deleted_fields(self._apply(kind, index, ds.record(kind, index, 0.0)))
        rec = self.shapes.apply(kind, index, ds.record(kind, index, badrow))
        if not self.changed or kind not in LIVE_KINDS:
            return rec
        return self._without_deleted_fields(self._apply(kind, index, rec))

    def _without_deleted_fields(self, rec: dict[str, Any]) -> dict[str, Any]:
        """The record without the values of fields deleted at the source (v2 `custom_fields`, v1
        top-level keys and their `_currency` companions)."""
        if not self.fields_deleted:
            return rec
        gone = set(self.fields_deleted)
        out = rec
        custom = rec.get("custom_fields")
        if isinstance(custom, dict) and gone & set(custom):
            out = dict(rec)
            out["custom_fields"] = {k: v for k, v in custom.items() if k not in gone}
        top = [k for k in rec if isinstance(k, str) and (k in gone or k.removesuffix("_currency") in gone)]
        if top:
            out = {k: v for k, v in out.items() if k not in top}
        return out

    def field_items(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A field list (v2 `field_code`/`field_name` or v1 `key`/`name` items) as the account has
        it now: renamed fields, relabelled options, deleted fields gone."""
        if not (self.field_names or self.option_labels or self.fields_deleted):
            return items
        gone = set(self.fields_deleted)
        out = []
        for item in items:
            key = item.get("field_code", item.get("key"))
            if key in gone:
                continue
            if key in self.field_names or key in self.option_labels:
                item = dict(item)
                name_field = "field_name" if "field_name" in item else "name"
                item[name_field] = self.field_names.get(key, item[name_field])
                labels = self.option_labels.get(key)
                if labels and isinstance(item.get("options"), list):
                    item["options"] = [{**o, "label": labels.get(o.get("id"), o.get("label"))} for o in item["options"]]
            out.append(item)
        return out

    def _apply(self, kind: str, index: int, rec: dict[str, Any]) -> dict[str, Any]:
        own = self.fields[kind].get(index)
        t = self.ts[kind].get(index)
        if own is None and t is None:
            return rec
        out = dict(rec)
        if own:
            out.update(own)
        if t is not None:
            served = self.update_ts(kind, index)
            out["update_time"] = _time_text(kind, served if served is not None else t)
        return out

    # ------------------------------------------------------------------ mail
    def deal_message_ids(self, deal_index: int) -> Sequence[int]:
        """The message ids listed under the deal at `deal_index` now: generated (and shaped), then added live."""
        base = self.shapes.deal_message_ids(deal_index)
        extra = self.mail_by_deal.get(deal_index) if self.mail else None
        return list(base) + extra if extra else base

    def mail_data(self, mid: int) -> dict[str, Any] | None:
        """A copy of the message a change added (without body), or None when no change added `mid`."""
        found = self.mail.get(mid)
        return dict(found[1]) if found else None

    def mail_body(self, mid: int) -> str | None:
        """The body of the message a change added, or None when no change added `mid`."""
        found = self.mail.get(mid)
        return found[2] if found else None

    def mail_list_item(self, mid: int) -> dict[str, Any]:
        """A message a change added, as the deal's mail list item (`object`, `timestamp`, `data`)."""
        data = self.mail[mid][1]
        return {"object": "mailMessage", "timestamp": data["timestamp"].replace("T", " ")[:19], "data": data}

    # ------------------------------------------------------------------ changing the account
    def step(self, n: int) -> list[dict[str, Any]]:
        """Apply n changes now (under the lock); returns them. ValueError when n is not 1..100000."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_STEP:
            raise ValueError(f"invalid n {n!r}: an integer in 1..{MAX_STEP} is required")
        with self.lock:
            return [self._apply_one() for _ in range(n)]

    def changes(self, since_seq: int = 0) -> list[dict[str, Any]]:
        """Copies of the changes applied after `since_seq` (each `{seq, at, op, kind, id, ...}`), oldest first."""
        with self.lock:
            return [dict(c) for c in self.log[max(0, since_seq):]]

    def _account_last_ts(self) -> int:
        ds = self.ds
        last = 0
        for kind in LIVE_KINDS:
            if ds.count(kind):
                last = max(last, ds.update_ts(kind, ds.count(kind) - 1))
        return last

    # ------------------------------------------------------------------ background changes
    @property
    def running(self) -> bool:
        """Whether the background changes are running."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        """(Re)start the background changes at the config's live_rate from now (0 = just stop)."""
        self.stop()
        rate = self._config().live_rate
        if rate <= 0:
            return
        self.prebuild_refs()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(rate, self._stop), name="pipedrive-sandbox-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background changes (waits for the change under way); idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._thread = None

    def _run(self, rate: float, stop: threading.Event) -> None:
        t0 = time.monotonic()
        made = 0
        while not stop.is_set():
            due = int((time.monotonic() - t0) * rate) - made
            with self.lock:
                if stop.is_set():
                    return
                cap = self._config().live_max
                for _ in range(max(0, min(due, 1000))):
                    if cap and self.applied >= cap:
                        break
                    self._apply_one()
                    made += 1
                if cap and self.applied >= cap:
                    stop.set()
                    return
            wait = t0 + (made + 1) / rate - time.monotonic()
            stop.wait(min(0.5, max(0.0, wait)))

    def status(self) -> dict[str, Any]:
        """`GET /_sandbox/live`'s body: `{applied, running, rate, max, mix}`."""
        config = self._config()
        return {"applied": self.applied, "running": self.running, "rate": config.live_rate, "max": config.live_max,
                "mix": dict(parse_live_mix(config.live_mix))}

    # ------------------------------------------------------------------ truth
    def extend_truth(self, out: dict[str, Any], kind: str | None) -> dict[str, Any]:
        """Make a truth answer (after the shapes') say what the account is now; add the live keys
        `deleted`, `merged`, `deleted_refs` and `changes_applied` (when kind is None or one of them)."""
        ds = self.ds
        if self.changed:
            ids = out.get("ids", {})
            for name in list(ids):
                base = name.removesuffix("_archived")
                if base in ("deals", "leads"):
                    archived = name.endswith("_archived")
                    ids[name] = [self.ident(base, i) for i in self.universe(base) if self.is_archived(base, i) == archived]
                elif base in LIVE_KINDS:
                    ids[name] = [self.ident(base, i) for i in self.universe(base)]
                elif base == "mail_messages":
                    ids[name] = list(ids[name]) + sorted(self.mail)
            if "deals_with_mail" in out:
                hosts = sorted(set(ds.mail_deal_index) | set(self.shapes.extra_by_deal) | set(self.mail_by_deal))
                out["deals_with_mail"] = {
                    str(self.ident("deals", d)): list(self.deal_message_ids(d)) for d in hosts if self.exists("deals", d)
                }
            if out.get("counts") is not None:
                counts = out["counts"]
                for name in ds.TRUTH_KINDS:
                    base = name.removesuffix("_archived")
                    if base in ("deals", "leads"):
                        archived = name.endswith("_archived")
                        counts[name] = sum(1 for i in self.universe(base) if self.is_archived(base, i) == archived)
                    elif base in LIVE_KINDS:
                        counts[name] = len(self.universe(base))
                counts["mail_messages"] += len(self.mail)
                counts["deals_with_mail"] = len(
                    {d for d in set(ds.mail_deal_index) | set(self.shapes.extra_by_deal) | set(self.mail_by_deal) if self.exists("deals", d)}
                )
            if "dangling" in out:
                out["dangling"] = {k: [x for x in v if self.index_of(k, x) is not None] for k, v in out["dangling"].items()}
            if "dangling_refs" in out:
                out["dangling_refs"] = {k: [r for r in v if self.index_of(k, r["id"]) is not None] for k, v in out["dangling_refs"].items()}
            if "malformed" in out:
                out["malformed"] = {k: [x for x in v if k not in LIVE_KINDS or self.index_of(k, x) is not None] for k, v in out["malformed"].items()}
                out["malformed_rows"] = {
                    k: [r for r in v if k not in LIVE_KINDS or self.index_of(k, r["id"]) is not None] for k, v in out["malformed_rows"].items()
                }
        if kind is None or kind == "deleted":
            out["deleted"] = {k: [self.ident(k, i) for i in v] for k, v in self.deleted.items()}
        if kind is None or kind == "merged":
            out["merged"] = {k: {str(self.ident(k, old)): self.ident(k, new) for old, new in sorted(v.items())} for k, v in self.merged.items()}
        if kind is None or kind == "deleted_refs":
            out["deleted_refs"] = self.deleted_refs()
        if kind is None or kind == "converted":
            out["converted"] = {str(self.ident("leads", i)): self.ident("deals", d) for i, d in sorted(self.converted.items())}
        if kind is None or kind == "field_changes":
            out["field_changes"] = {
                "renamed": dict(self.field_names),
                "relabelled": {k: {str(o): label for o, label in v.items()} for k, v in self.option_labels.items()},
                "deleted": list(self.fields_deleted),
            }
        out["changes_applied"] = self.applied
        return out

    def deleted_refs(self) -> dict[str, list[dict[str, Any]]]:
        """Per child kind, references of rows that exist now to rows deleted by a live change:
        {"id", "field", "parent_kind", "parent_id"} (GET of the parent answers 404)."""
        out: dict[str, list[dict[str, Any]]] = {k: [] for k in REF_FIELDS}
        if not any(self.deleted.values()):
            return out
        refs = self._ref_index()
        for parent, indexes in self.deleted.items():
            for pi in indexes:
                pid = self.ident(parent, pi)
                for child, ci, field in sorted(refs.get((parent, pid), ())):
                    if self.exists(child, ci) and self._refs_now(child, ci).get(field) == pid:
                        out[child].append({"id": self.ident(child, ci), "field": field, "parent_kind": parent, "parent_id": pid})
        for rows in out.values():
            rows.sort(key=lambda r: (str(r["id"]), r["field"]))
        return out


LIVE_TRUTH_KINDS: tuple[str, ...] = ("deleted", "merged", "deleted_refs", "converted", "field_changes", "changes_applied")
__all__ = ["Live", "LIVE_KINDS", "LIVE_OPS", "LIVE_TRUTH_KINDS", "OP_KINDS"]
