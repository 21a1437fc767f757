"""Token cost of every endpoint the sandbox serves, as the spec's `x-token-cost` says.

Keys are (api, path as written in that API's OpenAPI file); the canonical URL is the spec server's
path prefix (`/api/v2` for v2, `/v1` for v1) plus the path. A test asserts this table equals the
spec for every entry.
"""
from __future__ import annotations

TOKEN_COSTS: dict[tuple[str, str], int] = {
    # v2 (cursor pagination)
    ("v2", "/persons"): 10,
    ("v2", "/persons/{id}"): 1,
    ("v2", "/organizations"): 10,
    ("v2", "/organizations/{id}"): 1,
    ("v2", "/deals"): 10,
    ("v2", "/deals/archived"): 20,
    ("v2", "/deals/{id}"): 1,
    ("v2", "/activities"): 10,
    ("v2", "/activities/{id}"): 1,
    ("v2", "/pipelines"): 5,
    ("v2", "/pipelines/{id}"): 1,
    ("v2", "/stages"): 5,
    ("v2", "/stages/{id}"): 1,
    ("v2", "/personFields"): 10,
    ("v2", "/personFields/{field_code}"): 1,
    ("v2", "/organizationFields"): 10,
    ("v2", "/organizationFields/{field_code}"): 1,
    ("v2", "/dealFields"): 10,
    ("v2", "/dealFields/{field_code}"): 1,
    ("v2", "/activityFields"): 10,
    ("v2", "/activityFields/{field_code}"): 1,
    ("v2", "/products"): 10,
    ("v2", "/products/{id}"): 1,
    ("v2", "/productFields"): 10,
    ("v2", "/productFields/{field_code}"): 1,
    ("v2", "/deals/products"): 10,
    ("v2", "/deals/{id}/products"): 10,
    ("v2", "/deals/{id}/followers"): 10,
    ("v2", "/persons/{id}/followers"): 10,
    ("v2", "/organizations/{id}/followers"): 10,
    # v1 (offset pagination)
    ("v1", "/leads"): 20,
    ("v1", "/leads/archived"): 40,
    ("v1", "/leads/{id}"): 2,
    ("v1", "/notes"): 20,
    ("v1", "/notes/{id}"): 2,
    ("v1", "/users"): 20,
    ("v1", "/users/me"): 2,
    ("v1", "/users/{id}"): 2,
    ("v1", "/leadFields"): 20,
    ("v1", "/noteFields"): 20,
    ("v1", "/activityFields"): 20,
    ("v1", "/dealFields"): 20,
    ("v1", "/organizationFields"): 20,
    ("v1", "/personFields"): 20,
    ("v1", "/productFields"): 20,
    ("v1", "/deals/summary"): 40,
    ("v1", "/deals/summary/archived"): 80,
    ("v1", "/deals/{id}/mailMessages"): 20,
    ("v1", "/mailbox/mailMessages/{id}"): 2,
    ("v1", "/files"): 20,
    ("v1", "/files/{id}"): 2,
    ("v1", "/files/{id}/download"): 20,
    ("v1", "/deals/{id}/participants"): 10,
    ("v1", "/deals/{id}/flow"): 40,
    ("v1", "/deals/{id}/changelog"): 20,
}

API_PREFIX: dict[str, str] = {"v2": "/api/v2", "v1": "/v1"}


def template(api: str, spec_path: str) -> str:
    """The canonical URL template, e.g. ('v2', '/deals/{id}') -> '/api/v2/deals/{id}'."""
    return API_PREFIX[api] + spec_path
