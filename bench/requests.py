"""Requests and tokens: what a full run asks of the source, per kind, against the floor.

    python bench/requests.py [--scales tiny,small,seed] [--seed-divisor 20] [--mail] [--kinds six]

The engine is driven directly (`runs.start_run` + `drain_threads`, 4 lanes; no Dagster) against a
sandbox in this process with no latency and no rate limit, into a fresh database per account. The
sandbox counts every request and token it charges (`/_sandbox/stats`, per endpoint template);
each task counts what it asked (`requests` / `tokens` in its stats) and the tables below are by
task kind, with `start` = what the sandbox charged outside any task (the company's identity and
the snapshot's clock before the run's first task; pages asked ahead nobody took).

The run's kinds are the default ones (opt-in kinds left out), mail only with `--mail`; `--kinds six`:
the six a plain loader reads (organizations, persons, deals, leads, activities, notes; no archived
lists, which the catch-up then walks only to settle parents and which count against no floor). The floor
of a kind (issue 25) is one list call per 500 rows (100 for files), at the list's `x-token-cost`,
at least one call per list (deal products: one call per 100 deals, the `deal_ids` cap); `fields` is the seven field lists once; `start` the
identity once (`/v1/users/me`, 2 tokens); `catchup` one walk of every list, the same calls as
the lists' own floors (a quiet account's catch-up: nothing changed while the run walked, yet
only a whole id listing proves nothing was deleted: Pipedrive has no list of deleted or merged
ids and its lists carry no totals, so every live id must be served by a page of at most 500
rows, 100 for files; issue 25's "one call per kind" is what a sync that does not detect deletes
costs, `detect_deletes: false`); `emails` one mail listing per deal with mail and one body per
message. The ratio is ours / floor (1.00 = at the floor).

`seed` is a stand-in for the seed customer (about 400,000 records): its `ScaleSpec` with every
count divided by `--seed-divisor` (default 20: about 20,000 records), so that the shape of a large
account (lists of several pages, stripes) is measured in a minute, not an hour. The sandbox
serves it under the scale name `seed-customer`, in this process only.

Closing block: the requests and tokens ratios (ours / floor) of each account, the whole run's.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import TOKEN, Databases, print_ratios, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import runs  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.providers.pipedrive import kinds as pd_kinds  # noqa: E402
from engine_core.providers.pipedrive.provider import PipedriveProvider  # noqa: E402
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN  # noqa: E402
from engine_core.providers.registry import for_run  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402

SETTINGS = Settings(lane_width=4, heartbeat_seconds=1.0, retry_backoff_seconds=0.0)
UNLIMITED = 1_000_000
SIX = ["organizations", "persons", "deals", "leads", "activities", "notes", "emails"]
SCALE_NAMES = {"tiny": "tiny", "small": "small", "seed": "seed-customer"}
IDENTITY_TOKENS = 2  # /v1/users/me, a v1 single
MAIL_BODY_TOKENS = 2
# truth kind of each listed kind's rows (products come from the CRM truth)
TRUTH_OF = {k.name: k.name for k in pd_kinds.KINDS if k.paging in (pd_kinds.OFFSET, pd_kinds.CURSOR)}


def scaled_seed(divisor: int) -> None:
    """Serve `seed-customer` as its spec with every count divided by `divisor` (this process only)."""
    from pipedrive_sandbox import data

    spec = data.SCALE_SPECS["seed-customer"]
    counts = {f.name: max(1, getattr(spec, f.name) // divisor) for f in dataclasses.fields(spec)
              if f.type in ("int", int) and f.name not in ("pipelines", "stages_per_pipeline")}
    big = spec.big_deal_messages // divisor if spec.big_deal_messages else None
    data.SCALE_SPECS["seed-customer"] = dataclasses.replace(spec, **counts, big_deal_messages=big)


def floor(kinds: list[str], counts: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(requests, tokens) at the floor per task kind (module docstring) for the run's `kinds`."""
    out: dict[str, tuple[int, int]] = {}
    walk = [0, 0]  # the catch-up's walk of every list: (requests, tokens)
    for name in kinds:
        k = pd_kinds.BY_NAME[name]
        if k.paging in (pd_kinds.OFFSET, pd_kinds.CURSOR):
            calls = max(1, math.ceil(counts.get(name, 0) / (100 if name == "files" else pd_kinds.PAGE)))
            out[name] = (calls, calls * k.cost)
            walk = [walk[0] + calls, walk[1] + calls * k.cost]
        elif name == "fields":
            paths = [*pd_kinds.V2_FIELD_LISTS.values(), *pd_kinds.V1_FIELD_LISTS.values()]
            out[name] = (len(paths), sum(pd_kinds.FIELD_LIST_COSTS[p] for p in paths))
        elif k.paging == pd_kinds.BATCH:  # lines of up to 100 parents a call (`deal_ids`)
            deals = counts.get("deals", 0) + counts.get("deals_archived", 0)
            calls = max(1, math.ceil(deals / 100))
            out[name] = (calls, calls * k.cost)
        elif name == "emails":
            mail_deals, messages = counts.get("deals_with_mail", 0), counts.get("mail_messages", 0)
            out[name] = (mail_deals + messages, mail_deals * k.cost + messages * MAIL_BODY_TOKENS)
    out["catchup"] = (walk[0], walk[1])
    out["start"] = (1, IDENTITY_TOKENS)
    return out


def spent(db: dbmod.Database, run_id: int) -> dict[str, tuple[int, int]]:
    """(requests, tokens) per task kind, as the run's tasks counted them."""
    rows = db.sql("SELECT kind, sum(coalesce((stats->>'requests')::int, 0)) AS r,"
                  " sum(coalesce((stats->>'tokens')::int, 0)) AS t FROM migration_tasks"
                  " WHERE migration_id = %(r)s GROUP BY kind", {"r": run_id})
    return {r["kind"]: (int(r["r"]), int(r["t"])) for r in rows}


def measure(scale: str, db_url: str, kinds: list[str]) -> dict[str, Any]:
    """One full run of `kinds` on a fresh sandbox of `scale`: per kind ours and the floor, the
    sandbox's per-endpoint counters, and the totals."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import SandboxServer

    config = SandboxConfig(scale=scale, seed=1, token=TOKEN, burst_limit=UNLIMITED)
    with SandboxServer(config) as sb:
        os.environ[ENV_BASE_URL], os.environ[ENV_TOKEN] = sb.base_url, TOKEN
        truth = sb.truth()
        counts = dict(truth["counts"])
        if "products" in kinds:  # the CRM families' truth is asked by kind
            counts["products"] = len(sb.truth("products")["ids"]["products"])
        if "files" in kinds:
            counts["files"] = len(sb.truth("files")["files"])
        sb.reset_stats()
        db = dbmod.Database(db_url, max_size=8)
        try:
            provider = PipedriveProvider(base_url=sb.base_url)
            run = runs.start_run(db, provider, "bench", kinds=kinds,
                                 options={"base_url": sb.base_url, "burst_limit": UNLIMITED}, settings=SETTINGS)
            drain_threads(db, run.id, width=4, settings=SETTINGS, providers=for_run)
            done = runs.get_run(db, run.id)
            if done.status != "succeeded":
                raise SystemExit(f"{scale}: the run ended {done.status}")
            ours = spent(db, run.id)
        finally:
            db.close()
        stats = sb.stats()
    total = (int(stats["requests_total"]), int(stats["tokens_total"]))
    in_tasks = (sum(r for r, _ in ours.values()), sum(t for _, t in ours.values()))
    ours["start"] = (total[0] - in_tasks[0], total[1] - in_tasks[1])
    return {"ours": ours, "floor": floor(kinds, counts), "total": total, "counts": counts,
            "endpoints": {k: (v, stats["tokens"].get(k, 0)) for k, v in stats["requests"].items()}}


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(scale: str, m: dict[str, Any]) -> tuple[float, float]:
    ours, fl = m["ours"], m["floor"]
    order = ["start", *[k for k in fl if k not in ("start", "catchup")], "catchup"]
    order += sorted(k for k in ours if k not in order)
    print(f"\n{scale}: {sum(v for k, v in m['counts'].items() if k in TRUTH_OF or k == 'products'):,} listed rows")
    print(f"  {'kind':<16}{'requests':>9}{'floor':>7}{'ratio':>7}   {'tokens':>8}{'floor':>8}{'ratio':>7}")
    for k in order:
        (r, t), (fr, ft) = ours.get(k, (0, 0)), fl.get(k, (0, 0))
        print(f"  {k:<16}{r:>9}{fr:>7}{ratio(r, fr):>7.2f}   {t:>8}{ft:>8}{ratio(t, ft):>7.2f}")
    fr, ft = sum(v[0] for v in fl.values()), sum(v[1] for v in fl.values())
    r, t = m["total"]
    print(f"  {'total':<16}{r:>9}{fr:>7}{ratio(r, fr):>7.2f}   {t:>8}{ft:>8}{ratio(t, ft):>7.2f}")
    print("  by endpoint (the sandbox's counters):")
    for path, (n, tok) in sorted(m["endpoints"].items(), key=lambda kv: -kv[1][1]):
        print(f"    {path:<44}{n:>6} requests {tok:>8} tokens")
    return ratio(r, fr), ratio(t, ft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="tiny,small,seed", help="comma list of tiny, small, seed")
    parser.add_argument("--seed-divisor", type=int, default=20, help="the seed customer's counts divided by this")
    parser.add_argument("--mail", action="store_true", help="include the emails kind (mail listings and bodies)")
    parser.add_argument("--kinds", choices=("default", "six"), default="default",
                        help="the default kinds, or the six a plain loader reads")
    args = parser.parse_args()
    scales = [s.strip() for s in args.scales.split(",") if s.strip()]
    unknown = [s for s in scales if s not in SCALE_NAMES]
    if unknown:
        raise SystemExit(f"--scales: unknown {', '.join(unknown)} (one of {', '.join(SCALE_NAMES)})")
    if args.seed_divisor < 1:
        raise SystemExit(f"--seed-divisor must be at least 1, got {args.seed_divisor}")
    scaled_seed(args.seed_divisor)
    kinds = [k.name for k in pd_kinds.KINDS if k.default and (args.mail or k.name != "emails")]
    if args.kinds == "six":
        kinds = [k for k in SIX if k in kinds]  # emails only with --mail
    databases = Databases("requests")
    print(f"requests per kind against the floor; {server_facts(databases.server)}")
    lines = []
    try:
        for scale in scales:
            m = measure(SCALE_NAMES[scale], databases.new(), kinds)
            label = (scale if scale != "seed" else f"seed/{args.seed_divisor}") + (" six" if args.kinds == "six" else "")
            r, t = report(label, m)
            lines += [(f"{label}: requests / floor", r, f"{m['total'][0]} requests"),
                      (f"{label}: tokens / floor", t, f"{m['total'][1]} tokens")]
    finally:
        databases.close()
    print_ratios("requests (ours / floor; 1.00 = the floor)", lines)


if __name__ == "__main__":
    main()
