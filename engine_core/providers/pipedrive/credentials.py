"""The launch's token check: one cheap authenticated request before anything is placed.

Without it a wrong token would pass every check, start the run and fail it later with AuthError,
leaving a failed partition behind; `GET /v1/users/me` costs 2 of the account's daily tokens (the spec's
x-token-cost) and every Pipedrive account answers it with JSON.
"""
from __future__ import annotations

from engine_core.config import shown_url
from engine_core.errors import ConfigError
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import AuthError, BadResponse, NotFound, PipedriveError


def check_token(base_url: str, token: str, timeout: float, *, token_env: str, base_env: str) -> None:
    """Ask `GET /v1/users/me` once with `token`, no retry, `timeout` seconds at most.

    Raises ConfigError in one line naming `token_env` and the base URL (never the token) when
    Pipedrive refuses the token (401/403), and naming `base_env` when the server at `base_url` is
    no Pipedrive API (404, or a 200 whose body is not a Pipedrive user). Any other failure (a 5xx,
    a 429, a timeout) is no verdict on the token: it is left to the run's own retry policy."""
    shown = shown_url(base_url)
    try:
        with PipedriveClient(base_url, token, timeout=timeout, max_retries=0) as client:
            client.me()
    except AuthError as e:
        raise ConfigError(f"{token_env} was refused by {shown} (HTTP {e.status or '401'} on GET /v1/users/me): "
                          f"set it to the account's API token") from None
    except (NotFound, BadResponse, ValueError) as e:
        what = "HTTP 404" if isinstance(e, NotFound) else "no Pipedrive user (a body that is not its JSON)"
        raise ConfigError(f"{base_env} {shown} is not a Pipedrive API: GET /v1/users/me answered {what} "
                          f"(Pipedrive's API is at https://api.pipedrive.com)") from None
    except PipedriveError:
        return
