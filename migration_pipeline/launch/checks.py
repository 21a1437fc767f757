"""Checks before anything is launched: the tenant name, `--kinds` against the provider's plan, the
source's variables, its address (a TCP connect) and its token (one cheap request); the run config a
launch gives the tenant job. Imports no Dagster: the engine commands (`status`, `explain`, ...) use
these checks too."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

from engine_core import runs
from engine_core.config import shown_url
from engine_core.errors import ConfigError
from engine_core.plan import choose_kinds
from engine_core.providers.registry import provider_for
from engine_core.source import catchup_kind, identity_of, opt_in_kinds


class LaunchError(RuntimeError):
    """Dagster refused or failed to launch the run, or the run could not be waited for."""


def new_run_config(kinds: list[str] | None = None, dry_run: bool = False, options: dict[str, Any] | None = None) -> dict:
    """The run config a launch gives the tenant job: the `new_run` resource's config ({"options_json",
    "kinds"?, "dry_run"?}); it shapes a new engine run only (a joined or resumed run keeps its own)."""
    config: dict[str, Any] = {"options_json": json.dumps(options or {})}
    if kinds:
        config["kinds"] = list(kinds)
    if dry_run:
        config["dry_run"] = True
    return {"resources": {"new_run": {"config": config}}}


# The variables the Dagster resources read through EnvVar at launch (resources.source_resource).
SOURCE_ENV: dict[str, tuple[str, ...]] = {"pipedrive": ("PIPEDRIVE_BASE_URL", "PIPEDRIVE_API_TOKEN")}

# A tenant name: it is a Dagster partition key (shown in the UI, typed into its partition selector
# and backfill ranges, where "," and "..." separate keys and control characters are refused), the
# engine's tenant_id, and a word in run names and logs. ASCII letters, digits, ".", "_", "-",
# starting with a letter or digit, no "..", at most 63 characters (a Postgres identifier's length,
# room for a prefix). Every door checks it: the CLI, and the phase op for a partition added in the UI
# (Dagster's "Add a partition" dialog takes any key without a "," or control character).
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
TENANT_RULE = ("ASCII letters (A-Z, a-z), digits (0-9), '.', '_' or '-', starting with a letter or digit, "
               "no '..', at most 63 characters")


def check_tenant(tenant: str, given_as: str = "--tenant") -> str:
    """The tenant name, or ConfigError (one line, naming the value and `given_as`, how the command
    took it: "--tenant", or "TENANT" for a positional argument) when it is not TENANT_PATTERN:
    empty, spaces, slashes, commas, control characters, longer than 63 characters."""
    if not TENANT_PATTERN.fullmatch(tenant or "") or ".." in tenant:
        shown = tenant if len(tenant) <= 80 else tenant[:77] + "..."
        raise ConfigError(f"{given_as} {shown!r} is not a valid tenant name ({len(tenant)} characters): "
                          f"use {TENANT_RULE}")
    return tenant


# The variable naming each source's address, checked by a TCP connect before a launch (no request
# is sent, no budget spent): an unreachable source used to show only as a run paused minutes later.
SOURCE_URL_ENV: dict[str, str] = {"pipedrive": "PIPEDRIVE_BASE_URL"}
CONNECT_TIMEOUT_SECONDS = 5.0


# API version paths a source's client adds itself: a base URL ending in one (Pipedrive's
# https://api.pipedrive.com/v1, as its API reference writes URLs) doubles it, and every request
# answered 404.
SOURCE_URL_VERSION_PATHS: dict[str, tuple[str, ...]] = {"pipedrive": ("/api/v1", "/api/v2", "/v1", "/v2")}  # longest first


def check_source_url_path(source: str, env: dict[str, str] | None = None) -> None:
    """The source's base URL (SOURCE_URL_ENV) must not end in an API version path the client adds
    itself (SOURCE_URL_VERSION_PATHS). Raises ConfigError (one line naming the variable, the URL
    without any user:password part, and the URL to give instead)."""
    name = SOURCE_URL_ENV.get(source)
    url = (dict(os.environ if env is None else env).get(name or "", "") or "").strip()
    if not name or not url:
        return
    path = urlsplit(url).path.rstrip("/")
    suffix = next((v for v in SOURCE_URL_VERSION_PATHS.get(source, ()) if path.lower().endswith(v)), None)
    if suffix is not None:
        shown = shown_url(url)
        fixed = shown.rstrip("/")[: -len(suffix)]
        raise ConfigError(f"{name}={shown} ends in {suffix}, which the client adds itself (every request would "
                          f"answer 404): drop it, {name}={fixed}")


def check_source_reachable(source: str, env: dict[str, str] | None = None,
                           timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """A TCP connect to the host and port of the source's base URL (SOURCE_URL_ENV), within
    `timeout` seconds. Raises ConfigError (one line, naming the variable, its URL without any
    user:password part, and the connect error). Sources without a URL variable are not checked."""
    import socket

    name = SOURCE_URL_ENV.get(source)
    url = (dict(os.environ if env is None else env).get(name or "", "") or "").strip()
    if not name or not url:
        return
    parts = urlsplit(url)
    shown = shown_url(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"{name}={shown!r} has no valid port") from None
    if not parts.hostname:
        raise ConfigError(f"{name}={shown!r} names no host")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        why = f"no answer in {timeout:.0f} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ConfigError(f"{name}={shown}: cannot connect to {parts.hostname}:{port} ({why}); "
                          f"start the source or fix the URL") from None


def pickable_kinds(provider: Any) -> list[list[str]]:
    """The provider's phases without its catch-up phase (`catchup_kind`): the kinds a user may
    name in `--kinds`. The catch-up is a phase every run ends with (`runs.run_plan` keeps it), not
    a kind to pick."""
    ck = catchup_kind(provider)
    return [[k for k in group if k != ck] for group in provider.phases() if any(k != ck for k in group)]


def check_kinds(provider: Any, kinds: list[str]) -> None:
    """`--kinds` (a kinds choice, `engine_core.plan.choose_kinds`: plain names, `+name`/`-name`,
    `all`) against the provider's pickable kinds (`pickable_kinds`). Raises ConfigError (one line
    naming the option, the unknown kinds and the kinds there are)."""
    ck = catchup_kind(provider)
    phases = pickable_kinds(provider)
    if ck is not None and ck in [str(k).lstrip("+-").strip() for k in kinds]:
        known = sorted(k for group in phases for k in group)
        raise ConfigError(f"--kinds: {ck!r} is the catch-up phase every run ends with, not a kind to pick; "
                          f"kinds: {', '.join(known)}")
    try:
        choose_kinds(phases, kinds, opt_in_kinds(provider))
    except ConfigError as e:
        raise ConfigError(f"--kinds: {e}") from None


def unlinked_kinds(provider: Any, kinds: list[str] | None, held: Collection[str]) -> str | None:
    """A note (one line) when a kind a run of `kinds` (a kinds choice) takes links only to kinds
    (the provider's `depends_on`) that the run does not take and the tenant's ledger does not hold
    (`held`: ledger kinds; an archived list counts as its kind): every such row would be skipped
    ("not linked"), its requests spent for nothing (`--kinds emails` on a new tenant: every deal's
    mail listed, no message landed). None when every kind has a parent there, or `kinds` is None
    (the defaults take every parent)."""
    if not kinds:
        return None
    chosen = choose_kinds(pickable_kinds(provider), kinds, opt_in_kinds(provider)) or []
    there = set(chosen) | {k.removesuffix("_archived") for k in chosen} | set(held)
    lonely = [(k, deps) for k in chosen
              if (deps := tuple(provider.depends_on(k))) and not any(d.removesuffix("_archived") in there for d in deps)]
    if not lonely:
        return None
    said = "; ".join(f"{k} link to {' or '.join(dict.fromkeys(d.removesuffix('_archived') for d in deps))}"
                     for k, deps in lonely)
    return (f"note: {said}, which this run does not take and the tenant does not hold yet: their rows that "
            f"link to one will be skipped (not linked); take them too, e.g. --kinds "
            + ",".join(dict.fromkeys([*(d.removesuffix("_archived") for _, deps in lonely for d in deps), *chosen])))


def check_launch(source: str, kinds: list[str] | None, options: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
    """What would fail a launch, checked first: `kinds` against the provider's plan, the source's
    variables (set, and accepted by the provider's own configuration), then whether the source's
    base URL accepts a connection (`check_source_reachable`) and its token is accepted
    (`check_source_token`: one request); the run `options` by the provider's `check_options`.
    Raises ConfigError with a one-line message naming the option or the variable."""
    env = dict(os.environ if env is None else env)
    provider = provider_for(source)
    if kinds:
        check_kinds(provider, kinds)
    for name in SOURCE_ENV.get(source, ()):
        if not env.get(name, "").strip():
            raise ConfigError(f"{name} is not set (needed to launch a {source} run); see the README's Configuration")
    config = getattr(provider, "config", None)
    if callable(config):
        config()  # the provider's own checks (URL scheme, token shape, numbers), nothing sent
    check_options = getattr(provider, "check_options", None)
    if callable(check_options):  # the run options: names and values (runs.start_run checks them too)
        check_options(options or {})
    check_source_url_path(source, env)
    check_source_reachable(source, env)
    check_source_token(provider)


def check_tenant_source(db: Any, tenant: str, source: str) -> None:
    """Before a launch (`migrate run`, `migrate sync`): settings that reach another source than
    the tenant's data came from (another Pipedrive company) are refused in one line
    (TenantSourceMismatch, `runs.check_tenant_identity`) - the engine refuses them too, but only
    inside the Dagster run, whose step then failed and left a FAILURE run in the partition's
    history. One request (the source's company, paced by the account's budget in `db`) when the
    tenant has a run; none for a new tenant."""
    if runs.tenant_identity(db, tenant, source) is None:
        return
    runs.check_tenant_identity(db, tenant, source, identity_of(provider_for(source), db=db))


def check_source_token(provider: Any, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """One request with the source's credential, through the provider's `check_credentials` port
    (Pipedrive: `GET /v1/users/me`, 2 of the account's daily tokens, no retry). Raises ConfigError
    in one line naming the variable to fix (never the token); a provider without the port (the
    example source) has no credential to check."""
    check = getattr(provider, "check_credentials", None)
    if callable(check):
        check(timeout)
