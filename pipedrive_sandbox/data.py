"""Deterministic CRM data, generated on demand from (seed, kind, index).

Nothing here holds all rows: every record is rebuilt from a per-record RNG seeded with a stable
hash of (seed, kind, index), so the `seed-customer` scale (about 400,000 records and 90,000 mail
messages) starts in well under a second and stays small in memory. Only small indexes are kept:
the sorted positions of archived deals and leads, and the per-deal message counts of the deals that
have mail (with their prefix sums, so message ids map back to deals).

Shape of the account (like a real one):
* users own everything; organizations; persons in organizations (some without one);
* deals on persons/organizations, some archived (served only by the archived endpoint);
* leads on persons/organizations, some archived;
* activities and notes attached to deals, persons, organizations and leads;
* about 2% of the rows that reference other rows point at records that no longer exist
  (ids that fall in the gaps left by deleted records), listed in `truth()["dangling"]`;
* pipelines and stages; custom fields of the types varchar, text, double, monetary, date, enum,
  set, phone, user, org and people on deals (which leads inherit), persons and organizations;
* `add_time` and `update_time` grow strictly with the index (and so with the id), with jitter
  smaller than the step, so time filters and time sorts are computed by binary search;
* ids of every kind except users, pipelines and stages have gaps: ids divisible by 21 were
  "deleted", and dangling references point at such ids.

Malformed rows (the `badrow` fault) are chosen per (seed, kind, index) with the configured rate;
each gets one deterministic defect (missing id, id as a string, name as a dict, a 100k-character
string, NUL bytes, SQL or HTML injection text, hostile unicode, wrong types) and is listed in truth.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import math
import random
from array import array
from dataclasses import dataclass
from typing import Any, Iterator

from .clock import T0, T_END, UPDATE_LAG, day, parse_time, rfc3339
from .hashing import (
    S_DANGLE,
    S_FIELDS,
    S_FLAGS,
    S_MAIL,
    S_MALFORMED,
    S_NAME,
    S_PERSON,
    S_RECORD,
    S_TIME,
    S_UUID,
    S_VARIANT,
    make_uuid,
    mix,
    unit,
)
from .kinds import (
    DANGLING_KINDS,
    GAP_PERIOD,
    KIND_CODE,
    MALFORMABLE_KINDS,
    REF_FIELDS,
    id_to_index,
    index_to_id,
)
from .crm import Crm
from .records import MALFORMED_VARIANTS, Records
from .truth import Truth
from .vocab import (
    CITIES,
    CURRENCIES,
    CUSTOM_FIELD_TEMPLATES,
    FIRST_NAMES,
    FREEMAIL,
    HOSTILE_UNICODE,
    HTML_INJECTION,
    LAST_NAMES,
    ORG_SUFFIX,
    ORG_WORDS_A,
    ORG_WORDS_B,
    PRODUCTS,
    SQL_INJECTION,
    ascii_slug,
)


__all__ = [
    "CustomField", "Dataset", "ScaleSpec", "SCALE_SPECS", "dataset_for",
    # named from here by callers outside the package
    "GAP_PERIOD", "REF_FIELDS", "HOSTILE_UNICODE", "HTML_INJECTION", "SQL_INJECTION", "parse_time", "rfc3339",
]


@dataclass(frozen=True)
class ScaleSpec:
    """Record counts and mail shape of one scale."""

    users: int
    organizations: int
    persons: int
    deals: int
    leads: int
    activities: int
    notes: int
    pipelines: int
    stages_per_pipeline: int
    deals_with_mail: int
    messages: int
    big_deal_messages: int | None
    tail_mean: float = 4.4
    archived_deal_rate: float = 0.08
    archived_lead_rate: float = 0.2
    dangling_rate: float = 0.02
    products: int = 0
    files: int = 0

    @property
    def records(self) -> int:
        """Rows of the listed kinds (users to notes), mail and pipelines not counted."""
        return self.users + self.organizations + self.persons + self.deals + self.leads + self.activities + self.notes


SCALE_SPECS: dict[str, ScaleSpec] = {
    "tiny": ScaleSpec(
        users=4, organizations=30, persons=60, deals=50, leads=20, activities=60, notes=40,
        pipelines=2, stages_per_pipeline=4, deals_with_mail=12, messages=30, big_deal_messages=None,
        archived_deal_rate=0.12, archived_lead_rate=0.25, products=12, files=24,
    ),
    "small": ScaleSpec(
        users=15, organizations=600, persons=1500, deals=1200, leads=300, activities=900, notes=700,
        pipelines=3, stages_per_pipeline=5, deals_with_mail=400, messages=1000, big_deal_messages=None,
        products=80, files=300,
    ),
    "seed-customer": ScaleSpec(
        users=60, organizations=40000, persons=110000, deals=62000, leads=18000, activities=100000, notes=70000,
        pipelines=5, stages_per_pipeline=6, deals_with_mail=30788, messages=90000, big_deal_messages=1564,
        products=600, files=12000,
    ),
}

CUSTOM_ENTITIES: tuple[str, ...] = ("deal", "person", "organization", "product")
# Products carry only the custom field types that hold no reference to another row.
PRODUCT_FIELD_TYPES = frozenset({"varchar", "text", "double", "monetary", "date", "enum", "set"})


@dataclass(frozen=True)
class CustomField:
    """One custom field definition of an entity."""

    entity: str
    key: str
    name: str
    field_type: str
    options: tuple[tuple[int, str], ...]
    order: int


class Dataset(Records, Truth, Crm):
    """The whole account, rebuilt on demand from the seed.

    `badrow_rate` only changes which rows are malformed (and so truth); everything else depends on
    (scale, seed, big_deal_messages) alone.
    """

    def __init__(self, scale: str = "tiny", seed: int = 1, big_deal_messages: int | None = None) -> None:
        if scale not in SCALE_SPECS:
            raise ValueError(f"invalid scale {scale!r}")
        self.scale = scale
        self.seed = int(seed)
        self.spec = SCALE_SPECS[scale]
        self.big_deal_messages = self.spec.big_deal_messages if big_deal_messages is None else big_deal_messages
        spec = self.spec
        self.counts: dict[str, int] = {
            "users": spec.users,
            "organizations": spec.organizations,
            "persons": spec.persons,
            "deals": spec.deals,
            "leads": spec.leads,
            "activities": spec.activities,
            "notes": spec.notes,
            "pipelines": spec.pipelines,
            "stages": spec.pipelines * spec.stages_per_pipeline,
            "products": spec.products,
            "files": spec.files,
        }
        self.company_domain = self._company_domain()
        self.custom_fields: dict[str, tuple[CustomField, ...]] = {e: self._make_custom_fields(e) for e in CUSTOM_ENTITIES}
        self.archived_deals = self._flag_positions("deals", spec.archived_deal_rate)
        self.archived_leads = self._flag_positions("leads", spec.archived_lead_rate)
        self._archived_deal_set = frozenset(self.archived_deals)
        self._archived_lead_set = frozenset(self.archived_leads)
        self._build_mail_index()
        self.counts["mail_messages"] = self.message_total
        self._record_cache = functools.lru_cache(maxsize=16384)(self._build_record)
        # Cross-kind facts asked for again and again (every person of an org needs its domain).
        for name in ("org_name", "org_domain", "person_name", "person_org", "person_emails", "user_name", "user_email", "deal_title"):
            setattr(self, name, functools.lru_cache(maxsize=65536)(getattr(self, name)))

    # ----------------------------------------------------------------- basic hashing helpers
    def _h(self, *parts: int) -> int:
        return mix(self.seed, *parts)

    def _u(self, *parts: int) -> float:
        return unit(self.seed, *parts)

    def _rng(self, *parts: int) -> random.Random:
        return random.Random(mix(self.seed, *parts))

    def company(self) -> dict[str, Any]:
        """The company the account belongs to, as `/v1/users/me` reports it (one per seed)."""
        return {
            "company_id": 6000000 + (self.seed & 0xFFFF),
            "company_name": self.company_domain.split(".")[0].replace("-", " ").title(),
            "company_domain": self.company_domain.split(".")[0],
            "company_country": "EE",
            "language": {"language_code": "en", "country_code": "US"},
            "default_currency": "EUR",
            "lang": 1,
        }

    def _company_domain(self) -> str:
        rng = self._rng(S_NAME, 1)
        return f"{rng.choice(ORG_WORDS_A).lower()}-{rng.choice(ORG_WORDS_B).lower()}.example"

    def _flag_positions(self, kind: str, rate: float) -> array:
        code = KIND_CODE[kind]
        return array("i", (i for i in range(self.counts[kind]) if self._u(S_FLAGS, code, i) < rate))

    # ----------------------------------------------------------------- mail index
    def _build_mail_index(self) -> None:
        spec = self.spec
        n_deals = self.counts["deals"]
        k = min(spec.deals_with_mail, n_deals)
        rng = self._rng(S_MAIL, 0)
        chosen = sorted(rng.sample(range(n_deals), k)) if k else []
        big = self.big_deal_messages or 0
        big_pos = rng.randrange(k) if (big and k) else -1
        rest = k - (1 if big_pos >= 0 else 0)
        target_rest = max(rest, spec.messages - big) if big_pos >= 0 else max(rest, spec.messages)
        tail_share = 0.0
        if rest and spec.tail_mean > 1.5:
            tail_share = min(1.0, max(0.0, (target_rest - 1.5 * rest) / (spec.tail_mean - 1.5) / rest))
        geo_mean = max(0.0, spec.tail_mean - 3.0)
        log_q = math.log(geo_mean / (1.0 + geo_mean)) if geo_mean > 0 else None
        counts = array("i", [0] * k)
        for j in range(k):
            if j == big_pos:
                counts[j] = big
                continue
            if rng.random() < tail_share:
                extra = 0
                if log_q is not None:
                    extra = int(math.log(1.0 - rng.random()) / log_q)
                counts[j] = 3 + extra
            else:
                counts[j] = 1 + (rng.random() < 0.5)
        if big_pos >= 0 and big == 0:
            counts[big_pos] = 0
        # A deal chosen to carry 0 messages (big_deal_messages=0) simply has no mail.
        keep = [j for j in range(k) if counts[j] > 0]
        self.mail_deal_index = array("i", (chosen[j] for j in keep))
        self.mail_counts = array("i", (counts[j] for j in keep))
        prefix = array("q", [0])
        total = 0
        for c in self.mail_counts:
            total += c
            prefix.append(total)
        self.mail_prefix = prefix
        self.message_total = total

    def deal_message_ids(self, deal_index: int) -> range:
        """The message ids (consecutive) of the deal at `deal_index`; an empty range when it has no mail."""
        j = bisect.bisect_left(self.mail_deal_index, deal_index)
        if j < len(self.mail_deal_index) and self.mail_deal_index[j] == deal_index:
            return range(self.mail_prefix[j] + 1, self.mail_prefix[j + 1] + 1)
        return range(0)

    def message_location(self, message_id: int) -> tuple[int, int] | None:
        """(deal index, position within the deal) of a message id, or None."""
        if message_id < 1 or message_id > self.message_total:
            return None
        j = bisect.bisect_right(self.mail_prefix, message_id - 1) - 1
        return self.mail_deal_index[j], message_id - 1 - self.mail_prefix[j]

    # ----------------------------------------------------------------- times
    def _step(self, kind: str) -> int:
        n = max(1, self.counts[kind])
        return max(8, (T_END - UPDATE_LAG - T0) // n)

    def add_ts(self, kind: str, index: int) -> int:
        """The row's add_time in epoch seconds: grows strictly with the index (jitter under a quarter step)."""
        step = self._step(kind)
        return T0 + index * step + self._h(S_TIME, KIND_CODE[kind], index, 1) % (step // 4)

    def update_ts(self, kind: str, index: int) -> int:
        """The row's update_time in epoch seconds: add_time + 30 days + jitter; grows strictly with the index."""
        step = self._step(kind)
        return self.add_ts(kind, index) + UPDATE_LAG + self._h(S_TIME, KIND_CODE[kind], index, 2) % (step // 4)

    def first_index_at_or_after(self, kind: str, ts: int, field: str = "update_time") -> int:
        """The smallest index whose time field is >= ts (times grow strictly with the index)."""
        fn = self.update_ts if field == "update_time" else self.add_ts
        lo, hi = 0, self.counts[kind]
        while lo < hi:
            mid = (lo + hi) // 2
            if fn(kind, mid) < ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ----------------------------------------------------------------- cheap cross-kind facts
    def person_name(self, p: int) -> tuple[str, str]:
        """(first, last) name of person `p`."""
        rng = self._rng(S_PERSON, p, 1)
        return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)

    def person_org(self, p: int) -> int | None:
        """The organization index a person belongs to (None: no organization). Never dangling."""
        n_org = self.counts["organizations"]
        if not n_org or self._u(S_PERSON, p, 2) < 0.15:
            return None
        return self._h(S_PERSON, p, 3) % n_org

    def person_owner(self, p: int) -> int:
        """The user id owning person `p`."""
        return 1 + self._h(S_PERSON, p, 4) % self.counts["users"]

    def person_emails(self, p: int) -> tuple[str, ...]:
        """The person's addresses, primary first: none (8%), one at the organization's domain (or a
        free-mail one for persons without organization), sometimes a second free-mail one."""
        u = self._u(S_PERSON, p, 5)
        if u < 0.08:
            return ()
        first, last = self.person_name(p)
        org = self.person_org(p)
        style = self._h(S_PERSON, p, 6) % 4
        f, l = ascii_slug(first), ascii_slug(last).replace("-", "")
        local = (f"{f}.{l}", f"{f[0]}{l}", f"{f}_{l}", f"{f}.{l[0]}")[style]
        if org is None:
            domain = FREEMAIL[self._h(S_PERSON, p, 7) % len(FREEMAIL)]
            local += str(10 + self._h(S_PERSON, p, 8) % 9000)
        else:
            domain = self.org_domain(org)
        emails = [f"{local}@{domain}"]
        if u > 0.85:
            emails.append(f"{f}{10 + self._h(S_PERSON, p, 9) % 90}@{FREEMAIL[p % len(FREEMAIL)]}")
        return tuple(emails)

    def org_name(self, o: int) -> str:
        """Organization `o`'s name; about 3% repeat an earlier one's (duplicate names are common in real accounts)."""
        # About 3% of organizations share the name of an earlier one (duplicates are real life).
        if o > 10 and self._u(S_NAME, KIND_CODE["organizations"], o, 9) < 0.03:
            o = self._h(S_NAME, KIND_CODE["organizations"], o, 10) % o
        rng = self._rng(S_NAME, KIND_CODE["organizations"], o)
        a, b = rng.choice(ORG_WORDS_A), rng.choice(ORG_WORDS_B)
        if rng.random() < 0.3:
            a = rng.choice(LAST_NAMES)
        suffix = rng.choice(ORG_SUFFIX)
        return f"{a} {b} {suffix}".strip()

    def org_domain(self, o: int) -> str:
        """Organization `o`'s mail domain, from its name without the legal suffix (`.example`)."""
        words = self.org_name(o).split()
        if len(words) > 2 and words[-1] in ORG_SUFFIX:
            words = words[:-1]
        return ascii_slug(" ".join(words)) + ".example"

    def user_name(self, u: int) -> tuple[str, str]:
        """(first, last) name of user id `u`."""
        rng = self._rng(S_NAME, KIND_CODE["users"], u)
        return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)

    def user_email(self, u: int) -> str:
        """User id `u`'s address at the company's domain."""
        first, last = self.user_name(u)
        return f"{ascii_slug(first)}.{ascii_slug(last)}{u}@{self.company_domain}"

    def deal_person(self, d: int) -> int | None:
        """The person index of deal `d` (None for about 10%); before any dangling substitution."""
        if self._u(S_RECORD, KIND_CODE["deals"], d, 1) < 0.1:
            return None
        return self._h(S_RECORD, KIND_CODE["deals"], d, 2) % self.counts["persons"]

    def deal_org(self, d: int) -> int | None:
        """The organization index of deal `d`: its person's, else one drawn for 60% of the rest, else None."""
        p = self.deal_person(d)
        org = self.person_org(p) if p is not None else None
        if org is None and self.counts["organizations"] and self._u(S_RECORD, KIND_CODE["deals"], d, 3) < 0.6:
            org = self._h(S_RECORD, KIND_CODE["deals"], d, 4) % self.counts["organizations"]
        return org

    def deal_owner(self, d: int) -> int:
        """The user id owning deal `d`."""
        return 1 + self._h(S_RECORD, KIND_CODE["deals"], d, 5) % self.counts["users"]

    def deal_title(self, d: int) -> str:
        """Deal `d`'s title: `<organization or person> - <product>`, or `<product> #<id>`."""
        org = self.deal_org(d)
        product = PRODUCTS[self._h(S_RECORD, KIND_CODE["deals"], d, 6) % len(PRODUCTS)]
        if org is not None:
            return f"{self.org_name(org)} - {product}"
        p = self.deal_person(d)
        if p is not None:
            return f"{' '.join(self.person_name(p))} - {product}"
        return f"{product} #{index_to_id('deals', d)}"

    def lead_uuid(self, index: int) -> str:
        """Lead `index`'s id: a version-4 uuid drawn from the seed (leads have uuid ids in the v1 spec)."""
        return make_uuid(self._h(S_UUID, KIND_CODE["leads"], index, 1), self._h(S_UUID, KIND_CODE["leads"], index, 2))

    def lead_title(self, index: int) -> str:
        """Lead `index`'s title."""
        rng = self._rng(S_NAME, KIND_CODE["leads"], index)
        return f"{rng.choice(ORG_WORDS_A)} {rng.choice(PRODUCTS).lower()} lead"

    def lead_index(self, lead_id: str) -> int | None:
        """Lead index of a uuid (scans the uuids of the leads; leads are few)."""
        cache = getattr(self, "_lead_uuid_map", None)
        if cache is None:
            cache = {self.lead_uuid(i): i for i in range(self.counts["leads"])}
            self._lead_uuid_map = cache
        return cache.get(lead_id)

    def stage_pipeline(self, stage_index: int) -> int:
        """The pipeline index of stage `stage_index` (stages are numbered pipeline by pipeline)."""
        return stage_index // self.spec.stages_per_pipeline

    # ----------------------------------------------------------------- membership
    def is_archived(self, kind: str, index: int) -> bool:
        """Whether the generated deal or lead at `index` is archived (never for other kinds)."""
        if kind == "deals":
            return index in self._archived_deal_set
        if kind == "leads":
            return index in self._archived_lead_set
        return False

    def is_dangling(self, kind: str, index: int) -> bool:
        """Whether the row at `index` references a parent that no longer exists (about 2% of the dangling kinds)."""
        return kind in DANGLING_KINDS and self._u(S_DANGLE, KIND_CODE[kind], index) < self.spec.dangling_rate

    def dangling_ref(self, kind: str, index: int, target: str) -> int:
        """An id of `target` that does not exist (a deleted record's id, i.e. a gap)."""
        n = self.counts[target]
        max_id = index_to_id(target, max(0, n - 1))
        gaps = max_id // GAP_PERIOD
        if gaps >= 1:
            return GAP_PERIOD * (1 + self._h(S_DANGLE, KIND_CODE[kind], index, 1) % gaps)
        return max_id + 1 + self._h(S_DANGLE, KIND_CODE[kind], index, 1) % 100

    def is_malformed(self, kind: str, index: int, rate: float) -> bool:
        """Whether the row at `index` is served malformed at `rate` (the badrow fault)."""
        return rate > 0 and kind in MALFORMABLE_KINDS and self._u(S_MALFORMED, KIND_CODE[kind], index) < rate

    def malformed_variant(self, kind: str, index: int) -> str:
        """Which defect the row gets when malformed (one of MALFORMED_VARIANTS)."""
        return MALFORMED_VARIANTS[self._h(S_VARIANT, KIND_CODE[kind], index) % len(MALFORMED_VARIANTS)]

    def count(self, kind: str) -> int:
        """The number of generated rows of `kind` (created live rows not counted)."""
        return self.counts[kind]

    def exists(self, kind: str, index: int) -> bool:
        """Whether `index` is a generated row of `kind`."""
        return 0 <= index < self.counts[kind]

    # ----------------------------------------------------------------- custom fields
    def _make_custom_fields(self, entity: str) -> tuple[CustomField, ...]:
        out = []
        base = {"deal": 100, "person": 300, "organization": 500, "product": 700}[entity]
        for n, (ftype, name, options) in enumerate(CUSTOM_FIELD_TEMPLATES):
            if entity == "product" and ftype not in PRODUCT_FIELD_TYPES:
                continue
            key = hashlib.sha1(f"{self.seed}:{entity}:{n}".encode()).hexdigest()
            opts = tuple((base + 10 * n + k, label) for k, label in enumerate(options, start=1))
            out.append(CustomField(entity, key, name, ftype, opts, n))
        return tuple(out)

    def custom_values(self, entity: str, kind: str, index: int) -> dict[str, Any]:
        """v2-style custom field values (None when unset)."""
        rng = self._rng(S_FIELDS, KIND_CODE[kind], index)
        values: dict[str, Any] = {}
        for f in self.custom_fields[entity]:
            if rng.random() < 0.4:
                values[f.key] = None
                continue
            t = f.field_type
            if t == "varchar":
                values[f.key] = rng.choice(("Newsletter", "Trade fair", "Referral", "Cold call", "Webinar"))
            elif t == "text":
                values[f.key] = f"Met at {rng.choice(CITIES)[0]}. Interested in {rng.choice(PRODUCTS).lower()}."
            elif t == "double":
                values[f.key] = float(rng.randrange(1, 500))
            elif t == "monetary":
                values[f.key] = {"value": round(rng.uniform(1000, 250000), 2), "currency": rng.choice(CURRENCIES)}
            elif t == "date":
                values[f.key] = day(self.add_ts(kind, index) + rng.randrange(30, 700) * 86400)
            elif t == "enum":
                values[f.key] = rng.choice(f.options)[0]
            elif t == "set":
                values[f.key] = sorted(o[0] for o in rng.sample(f.options, rng.randrange(1, 3)))
            elif t == "phone":
                values[f.key] = f"+372 5{rng.randrange(1000000, 9999999)}"
            elif t == "user":
                values[f.key] = 1 + rng.randrange(self.counts["users"])
            elif t == "org":
                values[f.key] = index_to_id("organizations", rng.randrange(self.counts["organizations"]))
            elif t == "people":
                values[f.key] = index_to_id("persons", rng.randrange(self.counts["persons"]))
        return values

    # ----------------------------------------------------------------- ids and iteration
    def ident(self, kind: str, index: int) -> Any:
        """The id of the row at `index`: int ids with gaps, a uuid for leads, index + 1 for mail."""
        if kind == "leads":
            return self.lead_uuid(index)
        if kind == "mail_messages":
            return index + 1
        return index_to_id(kind, index)

    def index_of(self, kind: str, ident: Any) -> int | None:
        """Index of an id (None when no such record)."""
        if kind == "leads":
            return self.lead_index(str(ident))
        try:
            number = int(ident)
        except (TypeError, ValueError):
            return None
        if kind == "mail_messages":
            return number - 1 if 1 <= number <= self.message_total else None
        index = id_to_index(kind, number)
        if index is None or not self.exists(kind, index):
            return None
        return index

    def indexes(self, kind: str, subset: str = "all") -> Iterator[int]:
        """Indexes of a kind in id order; subset: all | active | archived."""
        if subset == "archived":
            yield from (self.archived_deals if kind == "deals" else self.archived_leads if kind == "leads" else ())
            return
        n = self.counts[kind]
        if subset == "active" and kind in ("deals", "leads"):
            archived = self._archived_deal_set if kind == "deals" else self._archived_lead_set
            yield from (i for i in range(n) if i not in archived)
            return
        yield from range(n)


@functools.lru_cache(maxsize=8)
def dataset_for(scale: str, seed: int, big_deal_messages: int | None) -> Dataset:
    """A shared Dataset per (scale, seed, big deal) in this process."""
    return Dataset(scale, seed, big_deal_messages)
