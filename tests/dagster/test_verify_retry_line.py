"""`migrate verify` over a source that answers some requests 503 prints one line summing the
retries by cause (stderr), not a line per retry before its result; the result and --json are as
before. It shows its progress as it reads (a line per kind read, before the result; nothing with
--json), from `engine_core.verify`'s progress callback."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import VerifyStep, verify
from migration_pipeline.cli.progress import VerifyDisplay
from migration_pipeline.instance import to_url
from tests.pipedrive.support import TOKEN, failed_tasks, migrate, sandbox

pytestmark = pytest.mark.timeout(300)
MIGRATE = str(Path(sys.executable).parent / "migrate")


def _side_by_side(env: dict[str, str], *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """`migrate <command>` for each of `commands`, all started at once; their results in order."""
    procs = [subprocess.Popen([MIGRATE, *c], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    done = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def test_verify_sums_its_retries_in_one_line(db, db_url, tmp_path):
    with sandbox() as sb:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        sb.configure(faults="503:0.25")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
        env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), PIPEDRIVE_BASE_URL=sb.base_url,
                   PIPEDRIVE_API_TOKEN=TOKEN)
        # side by side (both only read): each sleeps out its own retries' backoffs
        out, as_json = _side_by_side(env, ["verify", "acme"], ["verify", "acme", "--json"])
        sb.configure(faults="")
        steps: list[VerifyStep] = []
        proved = verify(db, PipedriveProvider(base_url=sb.base_url, token=TOKEN), "acme", progress=steps.append)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    assert "PASSED" in out.stdout
    assert not re.search(r"retry \d+/\d+", out.stderr + out.stdout), out.stderr[-2000:]
    (line,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
    found = re.fullmatch(r"the source was retried (\d+) time\(s\) \(HTTP 503 x (\d+)\); .*", line)
    assert found and found[1] == found[2] and int(found[1]) > 0, line
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["passed"] is True
    read = [k for k in proved.kinds if k.checked]
    assert [s.kind for s in steps if s.done] == [k.kind for k in read]
    for k in read:
        mine = [s for s in steps if s.kind == k.kind]
        assert mine[0].listed == 0 and not mine[0].done and mine[-1].done and mine[-1].listed == k.source, mine
        assert len({s.index for s in mine}) == 1, mine
    assert [s.index for s in steps] == sorted(s.index for s in steps) and len({s.total for s in steps}) == 1
    assert len(read) <= steps[-1].total == len({s.kind for s in steps})
    assert [s.requests for s in steps] == sorted(s.requests for s in steps) and steps[-1].requests > 0
    table = out.stdout.index("PASSED") if "PASSED" in out.stdout else len(out.stdout)
    shown = re.findall(r"verify acme: (\w+) \((\d+)/(\d+)\) read: ([\d,]+) ids", out.stdout[:table])
    assert [name for name, *_ in shown] == [k.kind for k in read], out.stdout[:3000]
    assert "verify acme:" not in as_json.stdout


def test_verify_progress_on_a_pipe_is_a_line_per_kind_read_and_one_per_ten_seconds_while_reading(capsys):
    clock = [0.0]
    display = VerifyDisplay("acme", as_json=False, clock=lambda: clock[0])
    quiet = VerifyDisplay("acme", as_json=True, clock=lambda: clock[0])
    for listed, at in ((0, 0.0), (100, 4.0), (200, 10.5), (300, 12.0), (400, 21.0)):
        clock[0] = at
        for d in (display, quiet):
            d(VerifyStep("emails", 2, 2, listed, listed // 2))
    display(VerifyStep("emails", 2, 2, 450, 230, done=True))
    display.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["  verify acme: reading emails (2/2): 200 ids so far; 100 requests so far",
                     "  verify acme: reading emails (2/2): 400 ids so far; 200 requests so far",
                     "  verify acme: emails (2/2) read: 450 ids; 230 requests so far"], lines
