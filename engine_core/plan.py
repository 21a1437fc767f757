"""The plan is data: a provider declares its phases as an ordered list of kind groups."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine_core.errors import ConfigError


def plan_for(phases: Sequence[Sequence[str]], kinds: Iterable[str] | None = None) -> list[list[str]]:
    """The phases a run needs: the provider's groups limited to `kinds`, empty groups dropped."""
    if kinds is None:
        return [list(group) for group in phases if group]
    wanted = list(dict.fromkeys(kinds))
    known = {k for group in phases for k in group}
    unknown = [k for k in wanted if k not in known]
    if unknown:
        raise ConfigError(f"unknown kinds {unknown}; this source has {sorted(known)}")
    limited = [[k for k in group if k in wanted] for group in phases]
    return [group for group in limited if group]
