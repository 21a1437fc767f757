"""Stable hashes: every generated value is a function of (seed, stream, kind, index), never of the
process (PYTHONHASHSEED) or of the order rows are asked for."""
from __future__ import annotations

import hashlib
import uuid

M64 = (1 << 64) - 1

# Independent hash streams.
S_RECORD, S_FLAGS, S_MALFORMED, S_VARIANT, S_NAME, S_PERSON, S_MAIL, S_TIME, S_UUID, S_FIELDS, S_DANGLE = range(1, 12)
S_CRM = 12  # products, deal products, files, participants, followers, deal history (crm.py)


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


def make_uuid(a: int, b: int) -> str:
    """A version-4 uuid string from two 64-bit numbers."""
    return str(uuid.UUID(int=((a & M64) << 64) | (b & M64), version=4))
