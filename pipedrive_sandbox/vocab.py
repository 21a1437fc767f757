"""The words the generator draws names, titles and bodies from, and the hostile texts of malformed rows."""
from __future__ import annotations

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
BODY_WORDS = (
    "we", "would", "like", "to", "confirm", "the", "order", "for", "next", "quarter", "pricing", "looks", "good",
    "please", "send", "updated", "contract", "our", "legal", "team", "will", "review", "meeting", "on", "Tuesday",
    "delivery", "schedule", "invoice", "attached", "thanks", "support", "licence", "renewal", "budget", "approved",
)

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


def ascii_slug(text: str) -> str:
    """`text` lower-cased to ASCII letters, digits and single dashes (umlauts folded, apostrophes
    dropped), for mail local parts and domains; `x` when nothing is left."""
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
