"""Small finds of a fresh user, each one line:

* a Pipedrive base URL ending in an API version path (`.../v1`, as Pipedrive's reference writes its
  URLs) is refused before anything is launched, saying to drop it and giving the URL to use (it had
  been "HTTP 404" with no hint);
* the sandbox's `--live-mix` help names every live op there is (it listed the older seven).
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pipedrive_sandbox.config import LIVE_OPS
from tests.dagster.test_cli_errors import _migrate_in_process, _nothing_launched, _one_line_error, run_env  # noqa: F401
from tests.pipedrive.support import TOKEN, sandbox


@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "/api/v2"])
def test_a_base_url_ending_in_an_api_version_is_told_to_drop_it(db_url, run_env, suffix):  # noqa: F811
    with sandbox() as sb:
        env = {**run_env, "PIPEDRIVE_BASE_URL": sb.base_url + suffix, "PIPEDRIVE_API_TOKEN": TOKEN}
        line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme"], env), "PIPEDRIVE_BASE_URL")
    assert f"ends in {suffix.rstrip('/')}, which the client adds itself" in line, line
    assert line.endswith(f"drop it, PIPEDRIVE_BASE_URL={sb.base_url}"), line
    _nothing_launched(db_url)


def test_the_live_mix_help_names_every_live_op():
    out = subprocess.run([sys.executable, "-m", "pipedrive_sandbox", "--help"], capture_output=True, text=True,
                         timeout=60)
    text = " ".join(out.stdout.split())
    said = text.split("--live-mix MIX ")[-1].split(" --")[0]  # the option's help, up to the next option
    found = re.search(r"over the ops (.*?) \(default", said)
    assert found and set(found[1].split(", ")) == set(LIVE_OPS), said
