"""The rest of the CRM, generated on demand like the core kinds: products, the products on each
deal (line items), files and their bytes, deal participants, followers, and each deal's history.

Every value is a function of (seed, family, index) alone and nothing is enumerated up front, so an
account costs the same to build with these families as without them: a deal's lines, participants
and history are drawn when that deal is asked for, a file's bytes when that file is downloaded.

* products - a gapped kind (ids divisible by 21 were purged: GET answers 404, and ~2% of deal lines
  still name such a product). Counts per scale in `ScaleSpec.products`.
* deal products - 0 lines on about half the deals, else 1-4; line id = deal index * 5 + k + 1, so
  ids are unique and sort by (deal, position). `sum` = quantity * item_price, less the discount
  (percentage or amount), plus the tax (`tax_method` exclusive), rounded to cents.
* files - `ScaleSpec.files` files, id = index + 1, each attached to a deal, person, organization
  or activity (the v1 file object has no note reference, so none hangs on a note). Bytes:
  `file_chunks` streams `file_size` bytes in 64 KiB chunks from a per-(file, version, chunk) RNG;
  version 0 is generated, a live `file_replace` raises it. `file_access` says which downloads
  answer 403 (private to another user) or 404 (purged from storage).
* participants - the deal's person (when it exists) and 0-2 others; id = deal index * 4 + k + 1.
* followers - of deals, persons and organizations: the owner, and 0-2 other users.
* deal history - the changes that led each deal to its served values: stage by stage from its
  pipeline's first stage to its `stage_id` (the last at its `stage_change_time`), an earlier
  `value` for about half, and `status` open -> won/lost at its `close_time`. Newest first.
"""
from __future__ import annotations

import random
from typing import Any, Iterator

from .clock import rfc3339, v1_time
from .hashing import S_CRM, mix, unit
from .kinds import GAP_PERIOD, KIND_CODE, index_to_id
from .vocab import PRODUCTS

FILE_CHUNK = 65536
LINES_PER_DEAL = 5  # line id stride (at most 4 lines: ids are unique and never collide)
PARTICIPANTS_PER_DEAL = 4  # participant id stride
HISTORY_PER_DEAL = 64  # generated change id stride
PRODUCT_UNITS = ("pcs", "seat", "hour", "month", "licence", "")
PRODUCT_CATEGORIES = ("Software", "Services", "Hardware", "Training")
TAX_RATES = (0.0, 9.0, 20.0, 22.0)
FILE_KINDS: tuple[tuple[str, float], ...] = (("deals", 0.45), ("persons", 0.2), ("organizations", 0.2), ("activities", 0.15))
FILE_TYPES: tuple[tuple[str, str, bytes], ...] = (
    ("pdf", "pdf", b"%PDF-1.4\n"),
    ("docx", "doc", b"PK\x03\x04"),
    ("xlsx", "spreadsheet", b"PK\x03\x04"),
    ("png", "img", b"\x89PNG\r\n\x1a\n"),
    ("jpg", "img", b"\xff\xd8\xff\xe0"),
    ("txt", "text", b""),
)
FILE_STEMS = ("Proposal", "Contract", "Quote", "Invoice", "Price list", "Meeting notes", "Logo", "NDA", "Specification")
USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36"


class Crm:
    """The generators of the families beyond the core kinds, mixed into `Dataset` (module docstring)."""

    def _crm_rng(self, family: str, *parts: int) -> random.Random:
        return random.Random(mix(self.seed, S_CRM, KIND_CODE[family], *parts))

    # ------------------------------------------------------------------ products
    def _build_products(self, i: int) -> dict[str, Any]:
        """Product `i` as `/api/v2/products` serves it (spec: BaseProduct + prices)."""
        rng = self._crm_rng("products", i)
        pid = index_to_id("products", i)
        base = PRODUCTS[i % len(PRODUCTS)]
        edition = ("Standard", "Pro", "Enterprise", "Starter", "Plus")[(i // len(PRODUCTS)) % 5]
        price = float(rng.randrange(2, 400) * 25)
        add = self.add_ts("products", i)
        return {
            "id": pid,
            "name": f"{base} {edition}" + ("" if i < 5 * len(PRODUCTS) else f" {i}"),
            "code": f"P-{pid:05d}",
            "description": f"{base} ({edition.lower()} edition)",
            "unit": rng.choice(PRODUCT_UNITS),
            "tax": rng.choice(TAX_RATES),
            "category": rng.choice(PRODUCT_CATEGORIES),
            "is_linkable": True,
            "is_deleted": False,
            "visible_to": rng.choice((3, 3, 7)),
            "owner_id": 1 + rng.randrange(self.counts["users"]),
            "add_time": rfc3339(add),
            "update_time": rfc3339(self.update_ts("products", i)),
            "billing_frequency": "one-time",
            "billing_frequency_cycles": None,
            "prices": [
                {"product_id": pid, "currency": cur, "price": round(price * rate, 2), "cost": round(price * rate * 0.6, 2), "direct_cost": None, "notes": ""}
                for cur, rate in (("EUR", 1.0), ("USD", 1.1))[: 1 + (rng.random() < 0.5)]
            ],
            "custom_fields": self.custom_values("product", "products", i),
        }

    # ------------------------------------------------------------------ deal products
    def deal_lines(self, d: int) -> list[dict[str, Any]]:
        """The product lines of generated deal `d` (v2 deal-product objects, in `order_nr` order);
        [] for about half the deals and for indexes past the generated ones."""
        if not 0 <= d < self.counts["deals"] or not self.counts["products"]:
            return []
        rng = self._crm_rng("deal_products", d)
        if rng.random() < 0.5:
            return []
        n = rng.choice((1, 1, 2, 2, 3, 4))
        deal = self.record("deals", d)
        add, upd = self.add_ts("deals", d), self.update_ts("deals", d)
        currency = deal["currency"] if isinstance(deal.get("currency"), str) else "EUR"
        lines = []
        for k in range(n):
            p = rng.randrange(self.counts["products"])
            product_id = index_to_id("products", p)
            name = self.record("products", p)["name"]
            if rng.random() < self.spec.dangling_rate:  # a product purged since it was added
                product_id = GAP_PERIOD * (1 + rng.randrange(max(1, index_to_id("products", self.counts["products"] - 1) // GAP_PERIOD)))
            quantity = rng.choice((1, 1, 2, 3, 5, 10, 20))
            item_price = float(rng.randrange(2, 400) * 25)
            discount_type = rng.choice(("percentage", "percentage", "amount"))
            discount = 0.0 if rng.random() < 0.6 else (float(rng.choice((5, 10, 15))) if discount_type == "percentage" else float(rng.randrange(1, 10) * 10))
            tax = rng.choice(TAX_RATES)
            t = add + (upd - add) * (k + 1) // (n + 2)
            lines.append({
                "id": d * LINES_PER_DEAL + k + 1,
                "sum": line_sum(quantity, item_price, discount, discount_type, tax),
                "tax": tax,
                "deal_id": index_to_id("deals", d),
                "name": name,
                "product_id": product_id,
                "product_variation_id": None,
                "order_nr": k + 1,
                "add_time": rfc3339(t),
                "update_time": rfc3339(t),
                "comments": "",
                "currency": currency,
                "discount": discount,
                "discount_type": discount_type,
                "quantity": quantity,
                "item_price": item_price,
                "tax_method": "exclusive",
                "is_enabled": True,
                "billing_frequency": "one-time",
                "billing_frequency_cycles": None,
                "billing_start_date": None,
            })
        return lines

    # ------------------------------------------------------------------ files
    def file_parent(self, i: int) -> tuple[str, int]:
        """(kind, index) of the row file `i` is attached to: a deal, person, organization or activity."""
        u = unit(self.seed, S_CRM, KIND_CODE["files"], i, 1)
        for kind, weight in FILE_KINDS:
            if u < weight:
                break
            u -= weight
        return kind, mix(self.seed, S_CRM, KIND_CODE["files"], i, 2) % self.counts[kind]

    def file_size(self, i: int, version: int = 0) -> int:
        """The size in bytes of file `i` at `version`: 1-256 KiB log-uniform (a mean of ~46 KiB), and
        1-3 MiB for one file in 97 (at least one at every scale, for tests of streaming and size limits)."""
        rng = self._crm_rng("files", i, 3, version)
        if (i + self.seed) % 97 == 5:
            return rng.randrange(1 << 20, 3 << 20)
        return int(1024 * 256 ** rng.random())

    def file_access(self, i: int) -> int:
        """The status a download of file `i` answers: 200, 403 (private to another user) or 404
        (purged from storage; its metadata is still listed). One file in 29 and one in 31 (a few at every scale)."""
        if (i + self.seed) % 29 == 7:
            return 403
        if (i + self.seed) % 31 == 11:
            return 404
        return 200

    def file_chunks(self, i: int, version: int, size: int) -> Iterator[bytes]:
        """The bytes of file `i` at `version`, `size` in all, in chunks of at most FILE_CHUNK: a type
        header, then bytes from a per-chunk RNG (so any chunk is made without the ones before it)."""
        ext, _, magic = FILE_TYPES[mix(self.seed, S_CRM, KIND_CODE["files"], i, 4) % len(FILE_TYPES)]
        head = magic + f"sandbox file {i + 1} version {version}\n".encode()
        sent = 0
        k = 0
        while sent < size:
            want = min(FILE_CHUNK, size - sent)
            chunk = random.Random(mix(self.seed, S_CRM, KIND_CODE["files"], i, 5, version, k)).randbytes(want)
            if k == 0:
                chunk = (head + chunk)[:want]
            sent += len(chunk)
            k += 1
            yield chunk

    def file_record(self, i: int, version: int = 0, update_ts: int | None = None) -> dict[str, Any]:
        """File `i`'s metadata as `/v1/files` serves it (the v1 file object; `url` its download)."""
        rng = self._crm_rng("files", i)
        fid = i + 1
        kind, p = self.file_parent(i)
        ext, ftype, _ = FILE_TYPES[mix(self.seed, S_CRM, KIND_CODE["files"], i, 4) % len(FILE_TYPES)]
        stem = rng.choice(FILE_STEMS)
        deal_id = person_id = org_id = activity_id = None
        if kind == "deals":
            deal_id = index_to_id("deals", p)
            dp, do = self.deal_person(p), self.deal_org(p)
            person_id = index_to_id("persons", dp) if dp is not None else None
            org_id = index_to_id("organizations", do) if do is not None else None
        elif kind == "persons":
            person_id = index_to_id("persons", p)
            po = self.person_org(p)
            org_id = index_to_id("organizations", po) if po is not None else None
        elif kind == "organizations":
            org_id = index_to_id("organizations", p)
        else:
            activity_id = index_to_id("activities", p)
            refs = self.refs("activities", p)
            deal_id, person_id, org_id = refs["deal_id"], refs["person_id"], refs["org_id"]
        parent_add = self.add_ts(kind, p)
        add = parent_add + rng.randrange(3600, 90 * 86400)
        upd = update_ts if update_ts is not None else add + rng.randrange(0, 3600)
        d = self.index_of("deals", deal_id) if deal_id is not None else None
        o = self.index_of("organizations", org_id) if org_id is not None else None
        pp = self.index_of("persons", person_id) if person_id is not None else None
        company = self.company_domain.split(".")[0]
        return {
            "id": fid,
            "user_id": 1 + rng.randrange(self.counts["users"]),
            "deal_id": deal_id,
            "person_id": person_id,
            "org_id": org_id,
            "product_id": None,
            "activity_id": activity_id,
            "lead_id": None,
            "log_id": None,
            "add_time": v1_time(add),
            "update_time": v1_time(upd),
            "file_name": f"{stem.replace(' ', '_')}_{fid}.{ext}",
            "file_type": ftype,
            "file_size": self.file_size(i, version),
            "active_flag": True,
            "inline_flag": False,
            "remote_location": "s3",
            "remote_id": f"{mix(self.seed, S_CRM, fid, version):016x}",
            "cid": "",
            "s3_bucket": "",
            "mail_message_id": "",
            "mail_template_id": "",
            "deal_name": self.deal_title(d) if d is not None else "",
            "person_name": " ".join(self.person_name(pp)) if pp is not None else "",
            "org_name": self.org_name(o) if o is not None else "",
            "product_name": "",
            "lead_name": "",
            "url": f"https://{company}.pipedrive.example/v1/files/{fid}/download",
            "name": f"{stem}.{ext}",
            "description": "",
        }

    # ------------------------------------------------------------------ participants and followers
    def deal_participant_persons(self, d: int) -> list[int]:
        """Person indexes taking part in generated deal `d`: its person first (when it has one), then 0-2 others."""
        if not 0 <= d < self.counts["deals"]:
            return []
        rng = self._crm_rng("participants", d)
        out: list[int] = []
        p = self.deal_person(d)
        if p is not None and not self.is_dangling("deals", d):
            out.append(p)
        for _ in range(rng.choice((0, 0, 1, 2))):
            q = rng.randrange(self.counts["persons"])
            if q not in out:
                out.append(q)
        return out

    def follower_users(self, kind: str, index: int, owner: int) -> list[int]:
        """User ids following the row (deals, persons, organizations): its owner, then 0-2 other users."""
        rng = self._crm_rng("followers", KIND_CODE[kind], index)
        out = [owner]
        for _ in range(rng.choice((0, 0, 1, 2))):
            u = 1 + rng.randrange(self.counts["users"])
            if u not in out:
                out.append(u)
        return out

    # ------------------------------------------------------------------ deal history
    def deal_changes(self, d: int) -> list[dict[str, Any]]:
        """The generated changes of deal `d`, oldest first: {id, field_key, old_value, new_value
        (text or None, as the changelog serves them), ts (epoch seconds), user_id}. Replaying them
        from the deal's creation ends at its generated `stage_id`, `value` and `status`."""
        if not 0 <= d < self.counts["deals"]:
            return []
        deal = self.record("deals", d)
        rng = self._crm_rng("deal_history", d)
        add, upd = self.add_ts("deals", d), self.update_ts("deals", d)
        stage_change = add + (upd - add) // 3
        per = self.spec.stages_per_pipeline
        stage = deal["stage_id"] - 1
        first = (stage // per) * per
        user = self.deal_owner(d)
        out: list[tuple[int, str, Any, Any]] = []
        steps = list(range(first + 1, stage + 1))
        for n, s in enumerate(steps):
            t = stage_change if n == len(steps) - 1 else add + (stage_change - add) * (n + 1) // (len(steps) + 1)
            out.append((t, "stage_id", s, s + 1))
        if rng.random() < 0.5:
            earlier = float(rng.randrange(0, 200) * 250)
            if earlier != deal["value"]:
                out.append((add + (upd - add) // 5, "value", earlier, deal["value"]))
        if deal["status"] != "open":
            out.append((add + (upd - add) // 2, "status", "open", deal["status"]))
        out.sort(key=lambda c: c[0])
        return [
            {"id": d * HISTORY_PER_DEAL + n + 1, "field_key": f, "old_value": change_text(old), "new_value": change_text(new), "ts": t, "user_id": user}
            for n, (t, f, old, new) in enumerate(out)
        ]


def line_sum(quantity: int, item_price: float, discount: float, discount_type: str, tax: float) -> float:
    """A deal product line's `sum`: quantity x item_price, less the discount (a percentage of it or
    an amount), plus `tax` percent on top (tax_method exclusive); rounded to cents."""
    base = quantity * item_price
    net = base * (1 - discount / 100.0) if discount_type == "percentage" else base - discount
    return round(max(0.0, net) * (1 + tax / 100.0), 2)


def change_text(value: Any) -> str | None:
    """A changed value as the changelog serves it: text (numbers without a trailing `.0`), or None."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

