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
import uuid
from array import array
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

M64 = (1 << 64) - 1
GAP_PERIOD = 21  # ids divisible by this were "deleted": they never appear, dangling refs point at them

KINDS: tuple[str, ...] = (
    "users",
    "organizations",
    "persons",
    "deals",
    "leads",
    "activities",
    "notes",
    "mail_messages",
    "pipelines",
    "stages",
)
KIND_CODE: dict[str, int] = {k: i + 11 for i, k in enumerate(KINDS)}
GAPPED_KINDS = frozenset({"organizations", "persons", "deals", "activities", "notes"})
MALFORMABLE_KINDS: tuple[str, ...] = ("organizations", "persons", "deals", "leads", "activities", "notes", "mail_messages")
DANGLING_KINDS: tuple[str, ...] = ("persons", "deals", "leads", "activities", "notes")
# The reference fields of each kind that can dangle: (field, parent kind).
REF_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "persons": (("org_id", "organizations"),),
    "deals": (("person_id", "persons"), ("org_id", "organizations")),
    "leads": (("person_id", "persons"), ("organization_id", "organizations")),
    "activities": (("deal_id", "deals"), ("lead_id", "leads"), ("person_id", "persons"), ("org_id", "organizations")),
    "notes": (("deal_id", "deals"), ("lead_id", "leads"), ("person_id", "persons"), ("org_id", "organizations")),
}

# Independent hash streams.
S_RECORD, S_FLAGS, S_MALFORMED, S_VARIANT, S_NAME, S_PERSON, S_MAIL, S_TIME, S_UUID, S_FIELDS, S_DANGLE = range(1, 12)

T0 = int(datetime(2019, 1, 1, tzinfo=timezone.utc).timestamp())
T_END = int(datetime(2026, 7, 31, tzinfo=timezone.utc).timestamp())
UPDATE_LAG = 30 * 86400


def mix(*parts: int) -> int:
    """A stable 64-bit hash of integers (splitmix64 finaliser per part); independent of PYTHONHASHSEED."""
    h = 0x9E3779B97F4A7C15
    for x in parts:
        h = ((h ^ (x & M64)) * 0xBF58476D1CE4E5B9) & M64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & M64
        h ^= h >> 29
    return h


def unit(*parts: int) -> float:
    """A stable uniform number in [0, 1) from integers."""
    return (mix(*parts) >> 11) / float(1 << 53)


def stable_hash(text: str) -> int:
    """A stable 64-bit hash of a string."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def rfc3339(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def v1_time(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def day(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d")


def parse_time(text: str) -> int:
    """Parse an RFC3339 / ISO 8601 time (or a date) to epoch seconds; ValueError when malformed."""
    value = text.strip()
    if not value:
        raise ValueError("empty time")
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    if len(value) == 10:
        parsed = datetime.strptime(value, "%Y-%m-%d")
    else:
        parsed = datetime.fromisoformat(value.replace(" ", "T", 1))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(math.floor(parsed.timestamp()))


def index_to_id(kind: str, index: int) -> int:
    if kind in GAPPED_KINDS:
        return index + 1 + index // (GAP_PERIOD - 1)
    return index + 1


def id_to_index(kind: str, ident: int) -> int | None:
    if ident < 1:
        return None
    if kind in GAPPED_KINDS:
        if ident % GAP_PERIOD == 0:
            return None
        return ident - 1 - ident // GAP_PERIOD
    return ident - 1


FIRST_NAMES = (
    "Anna", "Ben", "Carla", "David", "Elena", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Katrin", "Lukas",
    "Maria", "Niklas", "Olivia", "Paul", "Quinn", "Rosa", "Simon", "Tara", "Uwe", "Vera", "Walter", "Xenia",
    "Yusuf", "Zoe", "Aisha", "Bruno", "Chloe", "Diego", "Emma", "Farah", "George", "Hana", "Ivan", "Julia",
    "Kenji", "Lena", "Marco", "Nora", "Oscar", "Priya", "Rafael", "Sofia", "Tomas", "Ulla", "Victor", "Wanda",
    "Amir", "Beatriz", "Camille", "Dmitri", "Eva", "Fatima", "Gustav", "Helga", "Ingrid", "Jakub", "Kaisa",
    "Liam", "Mei", "Nils", "Orla", "Pekka", "Ruth", "Sven", "Tiina", "Olga", "Mateo", "Noah",
)
LAST_NAMES = (
    "Smith", "Müller", "Garcia", "Kowalski", "Nguyen", "Johansson", "Rossi", "Dubois", "Tanaka", "Kim",
    "Novak", "Silva", "Jensen", "Virtanen", "Horvat", "Popescu", "Ivanova", "Schmidt", "Fischer", "Weber",
    "Meyer", "Wagner", "Becker", "Hoffmann", "Koch", "Richter", "Klein", "Wolf", "Schröder", "Neumann",
    "Brown", "Taylor", "Wilson", "Evans", "Thomas", "Roberts", "Walker", "Wright", "Hall", "Green",
    "Lindqvist", "Andersen", "Nielsen", "Berg", "Dahl", "Lund", "Holm", "Strand", "Sato", "Suzuki",
    "Costa", "Santos", "Pereira", "Oliveira", "Martin", "Bernard", "Petit", "Durand", "Leroy", "Moreau",
    "O'Brien", "Murphy", "Kelly", "Byrne", "Ryan", "Walsh", "Tamm", "Saar", "Mägi", "Kask", "Rebane", "Ilves",
)
ORG_WORDS_A = (
    "Baltic", "Nordic", "Alpine", "Atlas", "Blue", "Bright", "Cedar", "Copper", "Delta", "Eagle", "Evergreen",
    "First", "Granite", "Harbor", "Iron", "Juniper", "Keystone", "Lakeside", "Maple", "Meridian", "North",
    "Oak", "Pacific", "Pioneer", "Quantum", "Redwood", "Silver", "Summit", "Tidal", "United", "Vertex",
    "Western", "Zenith", "Aurora", "Beacon", "Coastal", "Polar", "Riverside", "Sunrise", "Orbit",
)
ORG_WORDS_B = (
    "Logistics", "Freight", "Analytics", "Software", "Dynamics", "Foods", "Energy", "Health", "Robotics",
    "Media", "Consulting", "Partners", "Systems", "Textiles", "Motors", "Pharma", "Labs", "Holdings",
    "Retail", "Studios", "Ventures", "Solutions", "Construction", "Insurance", "Capital", "Networks",
)
ORG_SUFFIX = ("GmbH", "Ltd", "AS", "AB", "Oy", "OÜ", "Inc", "LLC", "SA", "BV", "", "", "")
FREEMAIL = ("mail.example", "inbox.example", "post.example")
PRODUCTS = ("CRM rollout", "Annual licence", "Support renewal", "Pilot", "Expansion", "Training", "Hardware", "Migration")
ACTIVITY_TYPES = ("call", "meeting", "email", "task", "deadline", "lunch")
LOST_REASONS = ("Price too high", "Went with competitor", "No budget", "No response", "Timing")
LEAD_SOURCES = ("Manually created", "Web forms", "Import", "Prospector", "Live chat", "API")
CURRENCIES = ("EUR", "USD", "GBP", "SEK")
CITIES = (("Tallinn", "EE"), ("Berlin", "DE"), ("Stockholm", "SE"), ("London", "GB"), ("Lisbon", "PT"), ("Austin", "US"))

HOSTILE_UNICODE = "\u202eevil\u202c \u200b\u200d\ufeff Z\u0337\u0322a\u0338l\u0335g\u0336o \U0001f4a9 \u2028line\u2029para \ufffe\uffff \u0007bell"
SQL_INJECTION = "Robert'); DROP TABLE persons;-- ' OR '1'='1"
HTML_INJECTION = "<script>alert('pwned')</script><img src=x onerror=alert(1)>&lt;b&gt;"
MALFORMED_VARIANTS: tuple[str, ...] = (
    "missing_id",
    "id_string",
    "name_dict",
    "oversize",
    "nul_bytes",
    "sql_injection",
    "html_injection",
    "hostile_unicode",
    "wrong_types",
)
NAME_FIELD = {
    "organizations": "name",
    "persons": "name",
    "deals": "title",
    "leads": "title",
    "activities": "subject",
    "notes": "content",
    "mail_messages": "subject",
}


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

    @property
    def records(self) -> int:
        return self.users + self.organizations + self.persons + self.deals + self.leads + self.activities + self.notes


SCALE_SPECS: dict[str, ScaleSpec] = {
    "tiny": ScaleSpec(
        users=4, organizations=30, persons=60, deals=50, leads=20, activities=60, notes=40,
        pipelines=2, stages_per_pipeline=4, deals_with_mail=12, messages=30, big_deal_messages=None,
        archived_deal_rate=0.12, archived_lead_rate=0.25,
    ),
    "small": ScaleSpec(
        users=15, organizations=600, persons=1500, deals=1200, leads=300, activities=900, notes=700,
        pipelines=3, stages_per_pipeline=5, deals_with_mail=400, messages=1000, big_deal_messages=None,
    ),
    "seed-customer": ScaleSpec(
        users=60, organizations=40000, persons=110000, deals=62000, leads=18000, activities=100000, notes=70000,
        pipelines=5, stages_per_pipeline=6, deals_with_mail=30788, messages=90000, big_deal_messages=1564,
    ),
}

# Custom field templates: (type, name, options). Keys are 40-hex hashes derived from the seed.
CUSTOM_FIELD_TEMPLATES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("varchar", "Source campaign", ()),
    ("text", "Background", ()),
    ("double", "Seats", ()),
    ("monetary", "Annual budget", ()),
    ("date", "Renewal date", ()),
    ("enum", "Priority", ("Low", "Medium", "High")),
    ("set", "Products of interest", ("CRM", "Billing", "Support", "Analytics", "Mobile")),
    ("phone", "Switchboard", ()),
    ("user", "Account manager", ()),
    ("org", "Partner organization", ()),
    ("people", "Referrer", ()),
)
CUSTOM_ENTITIES: tuple[str, ...] = ("deal", "person", "organization")


@dataclass(frozen=True)
class CustomField:
    """One custom field definition of an entity."""

    entity: str
    key: str
    name: str
    field_type: str
    options: tuple[tuple[int, str], ...]
    order: int


class Dataset:
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
        step = self._step(kind)
        return T0 + index * step + self._h(S_TIME, KIND_CODE[kind], index, 1) % (step // 4)

    def update_ts(self, kind: str, index: int) -> int:
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
        rng = self._rng(S_PERSON, p, 1)
        return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)

    def person_org(self, p: int) -> int | None:
        """The organization index a person belongs to (None: no organization). Never dangling."""
        n_org = self.counts["organizations"]
        if not n_org or self._u(S_PERSON, p, 2) < 0.15:
            return None
        return self._h(S_PERSON, p, 3) % n_org

    def person_owner(self, p: int) -> int:
        return 1 + self._h(S_PERSON, p, 4) % self.counts["users"]

    def person_emails(self, p: int) -> tuple[str, ...]:
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
        words = self.org_name(o).split()
        if len(words) > 2 and words[-1] in ORG_SUFFIX:
            words = words[:-1]
        return ascii_slug(" ".join(words)) + ".example"

    def user_name(self, u: int) -> tuple[str, str]:
        rng = self._rng(S_NAME, KIND_CODE["users"], u)
        return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)

    def user_email(self, u: int) -> str:
        first, last = self.user_name(u)
        return f"{ascii_slug(first)}.{ascii_slug(last)}{u}@{self.company_domain}"

    def deal_person(self, d: int) -> int | None:
        if self._u(S_RECORD, KIND_CODE["deals"], d, 1) < 0.1:
            return None
        return self._h(S_RECORD, KIND_CODE["deals"], d, 2) % self.counts["persons"]

    def deal_org(self, d: int) -> int | None:
        p = self.deal_person(d)
        org = self.person_org(p) if p is not None else None
        if org is None and self.counts["organizations"] and self._u(S_RECORD, KIND_CODE["deals"], d, 3) < 0.6:
            org = self._h(S_RECORD, KIND_CODE["deals"], d, 4) % self.counts["organizations"]
        return org

    def deal_owner(self, d: int) -> int:
        return 1 + self._h(S_RECORD, KIND_CODE["deals"], d, 5) % self.counts["users"]

    def deal_title(self, d: int) -> str:
        org = self.deal_org(d)
        product = PRODUCTS[self._h(S_RECORD, KIND_CODE["deals"], d, 6) % len(PRODUCTS)]
        if org is not None:
            return f"{self.org_name(org)} - {product}"
        p = self.deal_person(d)
        if p is not None:
            return f"{' '.join(self.person_name(p))} - {product}"
        return f"{product} #{index_to_id('deals', d)}"

    def lead_uuid(self, index: int) -> str:
        return make_uuid(self._h(S_UUID, KIND_CODE["leads"], index, 1), self._h(S_UUID, KIND_CODE["leads"], index, 2))

    def lead_title(self, index: int) -> str:
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
        return stage_index // self.spec.stages_per_pipeline

    # ----------------------------------------------------------------- membership
    def is_archived(self, kind: str, index: int) -> bool:
        if kind == "deals":
            return index in self._archived_deal_set
        if kind == "leads":
            return index in self._archived_lead_set
        return False

    def is_dangling(self, kind: str, index: int) -> bool:
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
        return rate > 0 and kind in MALFORMABLE_KINDS and self._u(S_MALFORMED, KIND_CODE[kind], index) < rate

    def malformed_variant(self, kind: str, index: int) -> str:
        return MALFORMED_VARIANTS[self._h(S_VARIANT, KIND_CODE[kind], index) % len(MALFORMED_VARIANTS)]

    def count(self, kind: str) -> int:
        return self.counts[kind]

    def exists(self, kind: str, index: int) -> bool:
        return 0 <= index < self.counts[kind]

    # ----------------------------------------------------------------- custom fields
    def _make_custom_fields(self, entity: str) -> tuple[CustomField, ...]:
        out = []
        base = {"deal": 100, "person": 300, "organization": 500}[entity]
        for n, (ftype, name, options) in enumerate(CUSTOM_FIELD_TEMPLATES):
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

    # ----------------------------------------------------------------- records
    def record(self, kind: str, index: int, badrow_rate: float = 0.0) -> dict[str, Any]:
        """The API-shaped record of `kind` at `index` (shared: copy before mutating)."""
        return self._record_cache(kind, index, badrow_rate)

    def _build_record(self, kind: str, index: int, badrow_rate: float) -> dict[str, Any]:
        builder = getattr(self, f"_build_{kind}")
        rec = builder(index)
        if self.is_malformed(kind, index, badrow_rate):
            rec = self._malform(kind, index, rec)
        return rec

    # References (REF_FIELDS) without building the row: the builders draw them the same way, first.
    def refs(self, kind: str, index: int) -> dict[str, Any]:
        """The reference fields of a row as the generator serves them ({field: id or None}, the
        fields of REF_FIELDS[kind]); a few microseconds, where building the row costs far more."""
        if kind == "persons":
            return self._person_refs(index)
        rng = self._rng(S_RECORD, KIND_CODE[kind], index)
        if kind == "deals":
            return self._deal_refs(index, rng)
        if kind == "leads":
            return self._lead_refs(index, rng)
        if kind in ("activities", "notes"):
            return self._target(kind, index, rng)
        raise KeyError(kind)

    def _person_refs(self, i: int) -> dict[str, Any]:
        org = self.person_org(i)
        org_id = index_to_id("organizations", org) if org is not None else None
        if self.is_dangling("persons", i):
            org_id = self.dangling_ref("persons", i, "organizations")
        return {"org_id": org_id}

    def _deal_refs(self, i: int, rng: random.Random) -> dict[str, Any]:
        """(Draws from the deal's record rng exactly as its builder does, before anything else.)"""
        person = self.deal_person(i)
        org = self.deal_org(i)
        person_id = index_to_id("persons", person) if person is not None else None
        org_id = index_to_id("organizations", org) if org is not None else None
        if self.is_dangling("deals", i):
            if person_id is not None and (org_id is None or rng.random() < 0.5):
                person_id = self.dangling_ref("deals", i, "persons")
            else:
                org_id = self.dangling_ref("deals", i, "organizations")
        return {"person_id": person_id, "org_id": org_id}

    def _lead_refs(self, i: int, rng: random.Random) -> dict[str, Any]:
        """(Draws from the lead's record rng exactly as its builder does, before anything else.)"""
        person = rng.randrange(self.counts["persons"]) if rng.random() < 0.8 else None
        org = self.person_org(person) if person is not None else None
        if person is None or (org is None and rng.random() < 0.3):
            org = rng.randrange(self.counts["organizations"])
        person_id = index_to_id("persons", person) if person is not None else None
        org_id = index_to_id("organizations", org) if org is not None else None
        if self.is_dangling("leads", i):
            if person_id is not None:
                person_id = self.dangling_ref("leads", i, "persons")
            else:
                org_id = self.dangling_ref("leads", i, "organizations")
        return {"person_id": person_id, "organization_id": org_id}

    def _build_users(self, i: int) -> dict[str, Any]:
        rng = self._rng(S_RECORD, KIND_CODE["users"], i)
        uid = i + 1
        first, last = self.user_name(uid)
        created = T0 - 86400 * 30 + i * 86400 * 3
        active = i == 0 or rng.random() > 0.1
        return {
            "id": uid,
            "name": f"{first} {last}",
            "default_currency": "EUR",
            "locale": "en_US",
            "lang": 1,
            "email": self.user_email(uid),
            "phone": f"+372 5{rng.randrange(1000000, 9999999)}" if rng.random() < 0.7 else None,
            "activated": True,
            "last_login": v1_time(T_END - rng.randrange(0, 90 * 86400)),
            "created": v1_time(created),
            "modified": v1_time(created + rng.randrange(86400, 300 * 86400)),
            "has_created_company": i == 0,
            "access": [
                {"app": "sales", "admin": i == 0, "permission_set_id": make_uuid(self._h(S_UUID, 1, 1), self._h(S_UUID, 1, 2 + (i == 0)))},
                {"app": "global", "admin": i == 0, "permission_set_id": make_uuid(self._h(S_UUID, 2, 1), self._h(S_UUID, 2, 2 + (i == 0)))},
            ],
            "active_flag": active,
            "timezone_name": "Europe/Tallinn",
            "timezone_offset": "+03:00",
            "role_id": 1,
            "icon_url": None,
            "is_you": i == 0,
            "is_deleted": False,
        }

    def _address(self, rng: random.Random) -> dict[str, Any]:
        city, country = rng.choice(CITIES)
        number = str(rng.randrange(1, 200))
        street = f"{rng.choice(LAST_NAMES)} {rng.choice(('Street', 'tee', 'straße', 'Road'))}"
        postal = str(rng.randrange(10000, 99999))
        return {
            "value": f"{street} {number}, {postal} {city}, {country}",
            "country": country,
            "admin_area_level_1": city,
            "admin_area_level_2": None,
            "locality": city,
            "sublocality": None,
            "route": street,
            "street_number": number,
            "subpremise": None,
            "postal_code": postal,
        }

    def _build_organizations(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["organizations"]
        rng = self._rng(S_RECORD, code, i)
        return {
            "id": index_to_id("organizations", i),
            "name": self.org_name(i),
            "owner_id": 1 + rng.randrange(self.counts["users"]),
            "add_time": rfc3339(self.add_ts("organizations", i)),
            "update_time": rfc3339(self.update_ts("organizations", i)),
            "is_deleted": False,
            "visible_to": rng.choice((3, 3, 7)),
            "address": self._address(rng) if rng.random() < 0.7 else None,
            "label_ids": [rng.randrange(1, 5)] if rng.random() < 0.2 else [],
            "custom_fields": self.custom_values("organization", "organizations", i),
        }

    def _build_persons(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["persons"]
        rng = self._rng(S_RECORD, code, i)
        first, last = self.person_name(i)
        org_id = self._person_refs(i)["org_id"]
        emails = self.person_emails(i)
        labels = ("work", "home", "other")
        return {
            "id": index_to_id("persons", i),
            "name": f"{first} {last}",
            "first_name": first,
            "last_name": last,
            "owner_id": self.person_owner(i),
            "org_id": org_id,
            "add_time": rfc3339(self.add_ts("persons", i)),
            "update_time": rfc3339(self.update_ts("persons", i)),
            "emails": [{"value": e, "primary": n == 0, "label": labels[min(n, 2)]} for n, e in enumerate(emails)],
            "phones": (
                [{"value": f"+{rng.choice((372, 49, 46, 44))} {rng.randrange(1000000, 99999999)}", "primary": True, "label": "work"}]
                if rng.random() < 0.7
                else []
            ),
            "is_deleted": False,
            "visible_to": rng.choice((3, 3, 7)),
            "label_ids": [rng.randrange(1, 5)] if rng.random() < 0.15 else [],
            "picture_id": None,
            "postal_address": self._address(rng) if rng.random() < 0.3 else None,
            "notes": None,
            "im": [],
            "birthday": None,
            "job_title": rng.choice(("CEO", "CTO", "Buyer", "Head of Sales", "Engineer", "Office manager", None)),
            "custom_fields": self.custom_values("person", "persons", i),
        }

    def _build_deals(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["deals"]
        rng = self._rng(S_RECORD, code, i)
        refs = self._deal_refs(i, rng)
        person_id, org_id = refs["person_id"], refs["org_id"]
        archived = self.is_archived("deals", i)
        n_pipe = self.counts["pipelines"]
        pipeline = 0 if rng.random() < 0.6 else rng.randrange(n_pipe)
        stage = pipeline * self.spec.stages_per_pipeline + rng.randrange(self.spec.stages_per_pipeline)
        add = self.add_ts("deals", i)
        upd = self.update_ts("deals", i)
        status = rng.choices(("open", "won", "lost"), (0.5, 0.3, 0.2))[0]
        if archived and status == "open" and rng.random() < 0.7:
            status = rng.choice(("won", "lost"))
        close = add + (upd - add) // 2 if status != "open" else None
        rec = {
            "id": index_to_id("deals", i),
            "title": self.deal_title(i),
            "creator_user_id": self.deal_owner(i),
            "owner_id": self.deal_owner(i),
            "person_id": person_id,
            "org_id": org_id,
            "pipeline_id": pipeline + 1,
            "stage_id": stage + 1,
            "value": float(rng.randrange(0, 200) * 250),
            "currency": rng.choice(CURRENCIES),
            "add_time": rfc3339(add),
            "update_time": rfc3339(upd),
            "stage_change_time": rfc3339(add + (upd - add) // 3),
            "is_deleted": False,
            "is_archived": archived,
            "archive_time": rfc3339(upd) if archived else None,
            "status": status,
            "probability": None,
            "lost_reason": rng.choice(LOST_REASONS) if status == "lost" else None,
            "visible_to": rng.choice((3, 3, 7)),
            "close_time": rfc3339(close) if close else None,
            "won_time": rfc3339(close) if status == "won" and close else None,
            "lost_time": rfc3339(close) if status == "lost" and close else None,
            "expected_close_date": day(add + rng.randrange(14, 180) * 86400) if rng.random() < 0.7 else None,
            "label_ids": [rng.randrange(1, 5)] if rng.random() < 0.2 else [],
            "origin": rng.choice(("ManuallyCreated", "ManuallyCreated", "Import", "API")),
            "origin_id": None,
            "channel": None,
            "channel_id": None,
            "source_lead_id": None,
            "arr": None,
            "mrr": None,
            "acv": None,
            "custom_fields": self.custom_values("deal", "deals", i),
        }
        return rec

    def _build_leads(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["leads"]
        rng = self._rng(S_RECORD, code, i)
        refs = self._lead_refs(i, rng)
        person_id, org_id = refs["person_id"], refs["organization_id"]
        owner = 1 + rng.randrange(self.counts["users"])
        add = self.add_ts("leads", i)
        rec: dict[str, Any] = {
            "id": self.lead_uuid(i),
            "title": self.lead_title(i),
            "owner_id": owner,
            "creator_id": owner,
            "label_ids": [make_uuid(self._h(S_UUID, 9, k), self._h(S_UUID, 10, k)) for k in range(rng.randrange(0, 2))],
            "person_id": person_id,
            "organization_id": org_id,
            "source_name": rng.choice(LEAD_SOURCES),
            "origin": "ManuallyCreated",
            "origin_id": None,
            "channel": None,
            "channel_id": None,
            "source_deal_id": None,
            "is_archived": self.is_archived("leads", i),
            "was_seen": rng.random() < 0.7,
            "value": {"amount": float(rng.randrange(1, 100) * 100), "currency": rng.choice(CURRENCIES)} if rng.random() < 0.6 else None,
            "expected_close_date": day(add + rng.randrange(14, 120) * 86400) if rng.random() < 0.5 else None,
            "next_activity_id": None,
            "add_time": iso_ms(add),
            "update_time": iso_ms(self.update_ts("leads", i)),
            "visible_to": rng.choice(("3", "3", "7")),
            "cc_email": f"{self.company_domain.split('.')[0]}+lead{self.lead_uuid(i).replace('-', '')[:20]}@pipedrivemail.example",
        }
        # Leads inherit the deal custom fields; v1 style: top-level keys, only when set.
        for key, value in self.custom_values("deal", "leads", i).items():
            if value is None:
                continue
            if isinstance(value, dict):  # monetary
                rec[key] = value["value"]
                rec[f"{key}_currency"] = value["currency"]
            elif isinstance(value, list):  # set: comma separated option ids, as v1 does
                rec[key] = ",".join(str(v) for v in value)
            else:
                rec[key] = value
        return rec

    def _target(self, kind: str, i: int, rng: random.Random) -> dict[str, Any]:
        """What an activity or note is attached to: ids of deal, lead, person and organization."""
        r = rng.random()
        deal_id = lead_id = person_id = org_id = None
        if r < 0.5 and self.counts["deals"]:
            d = rng.randrange(self.counts["deals"])
            deal_id = index_to_id("deals", d)
            p, o = self.deal_person(d), self.deal_org(d)
            person_id = index_to_id("persons", p) if p is not None else None
            org_id = index_to_id("organizations", o) if o is not None else None
        elif r < 0.75:
            p = rng.randrange(self.counts["persons"])
            person_id = index_to_id("persons", p)
            o = self.person_org(p)
            org_id = index_to_id("organizations", o) if o is not None else None
        elif r < 0.9:
            org_id = index_to_id("organizations", rng.randrange(self.counts["organizations"]))
        else:
            lead_id = self.lead_uuid(rng.randrange(self.counts["leads"]))
        if self.is_dangling(kind, i):
            if deal_id is not None:
                deal_id = self.dangling_ref(kind, i, "deals")
            elif person_id is not None:
                person_id = self.dangling_ref(kind, i, "persons")
            elif org_id is not None:
                org_id = self.dangling_ref(kind, i, "organizations")
            else:
                lead_id = make_uuid(self._h(S_DANGLE, 77, i), self._h(S_DANGLE, 78, i))
        return {"deal_id": deal_id, "lead_id": lead_id, "person_id": person_id, "org_id": org_id}

    def _build_activities(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["activities"]
        rng = self._rng(S_RECORD, code, i)
        t = self._target("activities", i, rng)
        add = self.add_ts("activities", i)
        due = add + 7 * 86400
        done = due < T_END - 10 * 86400 and rng.random() < 0.8
        owner = 1 + rng.randrange(self.counts["users"])
        atype = rng.choice(ACTIVITY_TYPES)
        return {
            "id": index_to_id("activities", i),
            "subject": f"{atype.capitalize()}: {rng.choice(PRODUCTS)}",
            "type": atype,
            "owner_id": owner,
            "creator_user_id": owner,
            "is_deleted": False,
            "add_time": rfc3339(add),
            "update_time": rfc3339(self.update_ts("activities", i)),
            "deal_id": t["deal_id"],
            "lead_id": t["lead_id"],
            "person_id": t["person_id"],
            "org_id": t["org_id"],
            "project_id": None,
            "due_date": day(due),
            "due_time": f"{rng.randrange(8, 18):02d}:{rng.choice((0, 15, 30, 45)):02d}",
            "duration": rng.choice(("00:15", "00:30", "01:00")),
            "busy": rng.random() < 0.5,
            "done": done,
            "marked_as_done_time": rfc3339(due + 3600) if done else None,
            "location": None,
            "participants": [{"person_id": t["person_id"], "primary": True}] if t["person_id"] is not None else [],
            "attendees": [],
            "conference_meeting_client": None,
            "conference_meeting_url": None,
            "conference_meeting_id": None,
            "public_description": "",
            "priority": None,
            "note": f"<p>{rng.choice(('Follow up', 'Send proposal', 'Demo', 'Check budget'))}</p>" if rng.random() < 0.5 else None,
        }

    def _build_notes(self, i: int) -> dict[str, Any]:
        code = KIND_CODE["notes"]
        rng = self._rng(S_RECORD, code, i)
        t = self._target("notes", i, rng)
        user = 1 + rng.randrange(self.counts["users"])
        first, last = self.user_name(user)
        rec: dict[str, Any] = {
            "id": index_to_id("notes", i),
            "active_flag": True,
            "add_time": v1_time(self.add_ts("notes", i)),
            "update_time": v1_time(self.update_ts("notes", i)),
            "content": f"<p>{rng.choice(('Called', 'Emailed', 'Met'))} about {rng.choice(PRODUCTS).lower()}; next step: {rng.choice(('quote', 'demo', 'contract', 'wait'))}.</p>",
            "deal_id": t["deal_id"],
            "lead_id": t["lead_id"],
            "person_id": t["person_id"],
            "org_id": t["org_id"],
            "project_id": None,
            "task_id": None,
            "last_update_user_id": user,
            "user_id": user,
            "pinned_to_deal_flag": t["deal_id"] is not None and rng.random() < 0.1,
            "pinned_to_organization_flag": False,
            "pinned_to_person_flag": False,
            "pinned_to_project_flag": False,
            "pinned_to_task_flag": False,
            "pinned_to_lead_flag": False,
            "user": {"email": self.user_email(user), "icon_url": None, "is_you": user == 1, "name": f"{first} {last}"},
        }
        d = id_to_index("deals", t["deal_id"]) if t["deal_id"] is not None else None
        rec["deal"] = {"title": self.deal_title(d)} if d is not None and self.exists("deals", d) else None
        o = id_to_index("organizations", t["org_id"]) if t["org_id"] is not None else None
        rec["organization"] = {"name": self.org_name(o)} if o is not None and self.exists("organizations", o) else None
        p = id_to_index("persons", t["person_id"]) if t["person_id"] is not None else None
        rec["person"] = {"name": " ".join(self.person_name(p))} if p is not None and self.exists("persons", p) else None
        rec["project"] = None
        rec["task"] = None
        return rec

    def _build_pipelines(self, i: int) -> dict[str, Any]:
        names = ("Sales", "Partners", "Renewals", "Enterprise", "Inbound", "Outbound", "Channel")
        return {
            "id": i + 1,
            "name": names[i % len(names)] + ("" if i < len(names) else f" {i + 1}"),
            "order_nr": i + 1,
            "is_deleted": False,
            "is_deal_probability_enabled": i == 0,
            "add_time": rfc3339(T0 - 86400 * 20 + i * 3600),
            "update_time": rfc3339(T0 - 86400 * 10 + i * 3600),
        }

    def _build_stages(self, i: int) -> dict[str, Any]:
        names = ("Qualified", "Contact made", "Proposal made", "Negotiation", "Verbal yes", "Contract sent")
        per = self.spec.stages_per_pipeline
        pos = i % per
        return {
            "id": i + 1,
            "order_nr": pos + 1,
            "name": names[pos % len(names)],
            "is_deleted": False,
            "deal_probability": min(100, 20 * (pos + 1)),
            "pipeline_id": self.stage_pipeline(i) + 1,
            "is_deal_rot_enabled": pos == 0,
            "days_to_rotten": 30 if pos == 0 else None,
            "add_time": rfc3339(T0 - 86400 * 20 + i * 60),
            "update_time": rfc3339(T0 - 86400 * 10 + i * 60),
        }

    # ----------------------------------------------------------------- mail
    def _party(self, pid: int, email: str, name: str, person_id: int | None) -> dict[str, Any]:
        return {
            "id": pid,
            "email_address": email,
            "name": name,
            "linked_person_id": person_id,
            "linked_person_name": name if person_id is not None else None,
            "mail_message_party_id": pid,
        }

    def _build_mail_messages(self, message_index: int) -> dict[str, Any]:
        """The `data` object of a mail message (index = id - 1), without the body."""
        mid = message_index + 1
        loc = self.message_location(mid)
        assert loc is not None
        d, pos = loc
        rng = self._rng(S_RECORD, KIND_CODE["mail_messages"], message_index)
        owner = self.deal_owner(d)
        p = self.deal_person(d)
        o = self.deal_org(d)
        user_party = self._party(2 * mid, self.user_email(owner), " ".join(self.user_name(owner)), None)
        if p is not None and self.person_emails(p):
            contact = self._party(2 * mid + 1, self.person_emails(p)[0], " ".join(self.person_name(p)), index_to_id("persons", p))
        else:
            domain = self.org_domain(o) if o is not None else FREEMAIL[mid % len(FREEMAIL)]
            contact = self._party(2 * mid + 1, f"info{mid % 97}@{domain}", "", None)
        inbound = rng.random() < 0.55
        sender, receiver = (contact, user_party) if inbound else (user_party, contact)
        deal_add = self.add_ts("deals", d)
        span = max(3600, T_END - deal_add)
        t = deal_add + (span * (pos + 1)) // (len(self.deal_message_ids(d)) + 1) + rng.randrange(0, 3600)
        subject = ("Re: " if pos else "") + self.deal_title(d)
        has_attach = rng.random() < 0.15
        return {
            "id": mid,
            "from": [sender],
            "to": [receiver],
            "cc": [],
            "bcc": [],
            "body_url": f"https://{self.company_domain.split('.')[0]}.pipedrive.example/v1/mailbox/mailMessages/{mid}/body",
            "account_id": f"acct{owner:06d}",
            "user_id": owner,
            "mail_thread_id": 1_000_000 + index_to_id("deals", d) * 4 + pos // 25,
            "subject": subject,
            "snippet": f"Hello, following up on {subject[:60]}",
            "mail_tracking_status": rng.choice(("opened", "not opened", None)),
            "mail_link_tracking_enabled_flag": 0,
            "read_flag": 1,
            "draft": "",
            "draft_flag": 0,
            "synced_flag": 1,
            "deleted_flag": 0,
            "has_body_flag": 1,
            "sent_flag": 0 if inbound else 1,
            "sent_from_pipedrive_flag": 0 if inbound else int(rng.random() < 0.5),
            "smart_bcc_flag": 0,
            "message_time": iso_ms(t),
            "add_time": iso_ms(t + 5),
            "update_time": iso_ms(t + 60),
            "has_attachments_flag": int(has_attach),
            "has_inline_attachments_flag": 0,
            "has_real_attachments_flag": int(has_attach),
            "nylas_id": f"{mix(self.seed, mid):016x}",
            "s3_bucket": "pipedrive-mail-sandbox",
            "s3_bucket_path": f"sandbox/{owner}/nylas/{mid}/body",
            "external_deleted_flag": False,
            "mua_message_id": f"{mix(self.seed, mid, 2):016x}@mailer.example",
            "item_type": "mailMessage",
            "timestamp": iso_ms(t + 60),
            "company_id": self.company()["company_id"],
        }

    def mail_body(self, message_id: int, badrow_rate: float = 0.0) -> str:
        """The HTML body of a message (a few KB; hostile when the message is malformed)."""
        rng = self._rng(S_RECORD, KIND_CODE["mail_messages"], message_id - 1, 99)
        loc = self.message_location(message_id)
        d = loc[0] if loc else 0
        paragraphs = [
            f"<p>{rng.choice(('Hi', 'Hello', 'Dear team'))},</p>",
            f"<p>Regarding {self.deal_title(d)}: {rng.choice(('attached is the quote', 'can we meet next week', 'thanks for the call', 'please find the contract'))}.</p>",
        ]
        for _ in range(rng.randrange(3, 30)):
            paragraphs.append("<p>" + " ".join(rng.choice(BODY_WORDS) for _ in range(rng.randrange(10, 40))) + ".</p>")
        if self.is_malformed("mail_messages", message_id - 1, badrow_rate):
            paragraphs.append(f"<p>{HTML_INJECTION}{HOSTILE_UNICODE}\u0000{SQL_INJECTION}</p>")
        paragraphs.append("<p>Best regards</p>")
        return "\n".join(paragraphs)

    def mail_list_item(self, message_id: int, badrow_rate: float = 0.0) -> dict[str, Any]:
        data = self.record("mail_messages", message_id - 1, badrow_rate)
        ts = data.get("timestamp") if isinstance(data.get("timestamp"), str) else iso_ms(T0)
        return {"object": "mailMessage", "timestamp": ts.replace("T", " ")[:19], "data": data}

    # ----------------------------------------------------------------- malformed rows
    def _malform(self, kind: str, index: int, rec: dict[str, Any]) -> dict[str, Any]:
        rec = dict(rec)
        variant = self.malformed_variant(kind, index)
        name_field = NAME_FIELD[kind]
        original = rec.get(name_field)
        if variant == "missing_id":
            rec.pop("id", None)
        elif variant == "id_string":
            rec["id"] = "abc"
        elif variant == "name_dict":
            rec[name_field] = {"value": original, "nested": {"oops": True}}
        elif variant == "oversize":
            rec[name_field] = (str(original) + " ") + ("x" * 100_000)
        elif variant == "nul_bytes":
            rec[name_field] = f"{original}\u0000\u0000tail"
        elif variant == "sql_injection":
            rec[name_field] = SQL_INJECTION
        elif variant == "html_injection":
            rec[name_field] = HTML_INJECTION
        elif variant == "hostile_unicode":
            rec[name_field] = f"{original} {HOSTILE_UNICODE}"
        elif variant == "wrong_types":
            for key in ("owner_id", "user_id", "add_time", "update_time"):
                if key in rec:
                    rec[key] = {"owner_id": "seven", "user_id": [1, 2], "add_time": 1234567890, "update_time": True}[key]
            if "custom_fields" in rec:
                rec["custom_fields"] = ["not", "an", "object"]
        return rec

    # ----------------------------------------------------------------- iteration and truth
    def ident(self, kind: str, index: int) -> Any:
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

    TRUTH_KINDS: tuple[str, ...] = (
        "users",
        "organizations",
        "persons",
        "deals",
        "deals_archived",
        "leads",
        "leads_archived",
        "activities",
        "notes",
        "mail_messages",
        "pipelines",
        "stages",
    )

    def truth_ids(self, name: str) -> list[Any]:
        if name == "deals":
            return [self.ident("deals", i) for i in self.indexes("deals", "active")]
        if name == "deals_archived":
            return [self.ident("deals", i) for i in self.indexes("deals", "archived")]
        if name == "leads":
            return [self.ident("leads", i) for i in self.indexes("leads", "active")]
        if name == "leads_archived":
            return [self.ident("leads", i) for i in self.indexes("leads", "archived")]
        if name == "mail_messages":
            return list(range(1, self.message_total + 1))
        return [self.ident(name, i) for i in range(self.counts[name])]

    def deals_with_mail(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for j, d in enumerate(self.mail_deal_index):
            out[str(index_to_id("deals", d))] = list(range(self.mail_prefix[j] + 1, self.mail_prefix[j + 1] + 1))
        return out

    def malformed(self, rate: float) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for kind in MALFORMABLE_KINDS:
            rows = []
            if rate > 0:
                n = self.message_total if kind == "mail_messages" else self.counts[kind]
                code = KIND_CODE[kind]
                for i in range(n):
                    if self._u(S_MALFORMED, code, i) < rate:
                        rows.append({"id": self.ident(kind, i), "position": i, "variant": self.malformed_variant(kind, i)})
            out[kind] = rows
        return out

    def dangling(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for kind in DANGLING_KINDS:
            code = KIND_CODE[kind]
            rate = self.spec.dangling_rate
            ids = []
            for i in range(self.counts[kind]):
                if self._u(S_DANGLE, code, i) < rate:
                    ids.append(self.ident(kind, i))
            out[kind] = ids
        return out

    def dangling_refs(self) -> dict[str, list[dict[str, Any]]]:
        """Per child kind, every reference to a purged parent: {"id": child id, "field": "org_id",
        "parent_kind": "organizations", "parent_id": the id GET answers 404 for}. Read from the
        served records themselves, so it says exactly what a consumer sees."""
        out: dict[str, list[dict[str, Any]]] = {}
        for kind in DANGLING_KINDS:
            code = KIND_CODE[kind]
            refs: list[dict[str, Any]] = []
            for i in range(self.counts[kind]):
                if self._u(S_DANGLE, code, i) >= self.spec.dangling_rate:
                    continue
                rec = self.record(kind, i)
                for field_name, parent in REF_FIELDS[kind]:
                    value = rec.get(field_name)
                    if value is not None and self.index_of(parent, value) is None:
                        refs.append({"id": self.ident(kind, i), "field": field_name, "parent_kind": parent, "parent_id": value})
            out[kind] = refs
        return out

    def truth(self, badrow_rate: float = 0.0, kind: str | None = None) -> dict[str, Any]:
        """Reconciliation facts; `kind` limits the answer to one entry (a truth kind, or
        `deals_with_mail`, `malformed`, `dangling`, `dangling_refs`, `counts`)."""
        wanted = [kind] if kind else list(self.TRUTH_KINDS) + ["deals_with_mail", "malformed", "dangling", "dangling_refs", "counts"]
        ids: dict[str, Any] = {}
        out: dict[str, Any] = {"scale": self.scale, "seed": self.seed}
        for name in wanted:
            if name in self.TRUTH_KINDS:
                ids[name] = self.truth_ids(name)
            elif name == "deals_with_mail":
                out["deals_with_mail"] = self.deals_with_mail()
            elif name == "malformed":
                detail = self.malformed(badrow_rate)
                out["malformed"] = {k: [r["id"] for r in rows] for k, rows in detail.items()}
                out["malformed_rows"] = detail
            elif name == "dangling":
                out["dangling"] = self.dangling()
            elif name == "dangling_refs":
                out["dangling_refs"] = self.dangling_refs()
            elif name == "counts":
                counts = {k: len(self.truth_ids(k)) if k in ("deals", "deals_archived", "leads", "leads_archived") else self.counts.get(k, 0) for k in self.TRUTH_KINDS}
                counts["mail_messages"] = self.message_total
                counts["deals_with_mail"] = len(self.mail_deal_index)
                out["counts"] = counts
            else:
                raise KeyError(name)
        if ids:
            out["ids"] = ids
        return out


BODY_WORDS = (
    "we", "would", "like", "to", "confirm", "the", "order", "for", "next", "quarter", "pricing", "looks", "good",
    "please", "send", "updated", "contract", "our", "legal", "team", "will", "review", "meeting", "on", "Tuesday",
    "delivery", "schedule", "invoice", "attached", "thanks", "support", "licence", "renewal", "budget", "approved",
)


def ascii_slug(text: str) -> str:
    table = str.maketrans({"ä": "a", "ö": "o", "ü": "u", "õ": "o", "Ä": "a", "Ö": "o", "Ü": "u", "ß": "ss", "'": "", "Ü": "u"})
    out = []
    for ch in text.translate(table).lower():
        if ch.isascii() and ch.isalnum():
            out.append(ch)
        elif ch in " -_":
            out.append("-")
    slug = "".join(out).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return slug or "x"


def make_uuid(a: int, b: int) -> str:
    """A version-4 uuid string from two 64-bit numbers."""
    return str(uuid.UUID(int=((a & M64) << 64) | (b & M64), version=4))


@functools.lru_cache(maxsize=8)
def dataset_for(scale: str, seed: int, big_deal_messages: int | None) -> Dataset:
    """A shared Dataset per (scale, seed, big deal) in this process."""
    return Dataset(scale, seed, big_deal_messages)
