"""`python -m pipedrive_sandbox`: serve the sandbox in the foreground (same options as `migrate sandbox`)."""
from __future__ import annotations

import argparse
import sys

from .config import DEFAULT_LIVE_MIX, LIVE_OPS, SandboxConfig
from .server import serve


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m pipedrive_sandbox` (the same options as `migrate sandbox`)."""
    p = argparse.ArgumentParser(prog="python -m pipedrive_sandbox", description="A faithful Pipedrive API sandbox on 127.0.0.1.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port (reported as 'SANDBOX_READY <url>')")
    p.add_argument("--scale", default="small", help="tiny | small | seed-customer (default small, as `migrate sandbox`)")
    p.add_argument("--seed", default="1")
    p.add_argument("--token", default="sandbox-token")
    p.add_argument("--latency", default="none", help="none | realistic | realistic:<factor>")
    p.add_argument("--faults", default="", help="comma list kind:rate; kinds 500,502,503,slow,drop,badjson,badrow")
    p.add_argument("--burst-limit", default="80", help="requests a burst window lets through before 429")
    p.add_argument("--daily-budget", default=None, help="tokens per simulated day (default: unlimited)")
    p.add_argument("--day-seconds", default="86400")
    p.add_argument("--big-deal-messages", default=None)
    p.add_argument("--page-limit-max", default="500")
    p.add_argument("--slow-seconds", default="30")
    p.add_argument("--burst-window-seconds", default="2", help="the burst window's length")
    shapes = p.add_argument_group("API shapes (all off by default)")
    shapes.add_argument("--page-cap", default="0", help="serve at most N rows a page whatever limit asks (0 = off)")
    shapes.add_argument("--empty-pages", action="store_true", help="v2 lists answer data: [] with a next_cursor on their first page")
    shapes.add_argument("--null-update-time", default="0", help="N rows of each kind have update_time null")
    shapes.add_argument("--archive-flip", default="0", help="N active deals and leads move to the archived list once served")
    shapes.add_argument("--hostile-mail", action="store_true", help="four extra messages: huge, NUL, lone surrogate, invalid UTF-8")
    shapes.add_argument("--private-mail", default="0", help="N messages whose body fetch answers 403 (even id) / 404 (odd id)")
    shapes.add_argument("--forbidden-fanout", default="0", help="N deals, persons and organizations whose per-row lists (products, participants, followers, flow, changelog) answer 403")
    shapes.add_argument("--private-deal-mail", default="0", help="N deals with mail whose mail listing answers 403")
    shapes.add_argument("--long-notes", default="0", help="N notes served with 1,500,000+ characters (HTML, inline base64 image)")
    live = p.add_argument_group("live account (off by default)")
    live.add_argument("--live", dest="live_rate", default="0", metavar="RATE", help="changes per second to the account while it serves (0 = off)")
    live.add_argument("--live-max", default="0", metavar="N", help="stop the changes after N in all (0 = no cap)")
    live.add_argument("--live-mix", default="", metavar="MIX",
                      help=f"op weights 'op:weight,...' over the ops {', '.join(LIVE_OPS)} (default {DEFAULT_LIVE_MIX}; "
                           "an op left out weighs 0)")
    return p


def config_from_args(ns: argparse.Namespace) -> SandboxConfig:
    """A SandboxConfig from parsed arguments; ValueError names the bad option."""
    return SandboxConfig.from_options(
        scale=ns.scale,
        seed=ns.seed,
        token=ns.token,
        latency=ns.latency,
        faults=ns.faults,
        burst_limit=ns.burst_limit,
        daily_budget=ns.daily_budget,
        day_seconds=ns.day_seconds,
        big_deal_messages=ns.big_deal_messages,
        page_limit_max=ns.page_limit_max,
        slow_seconds=ns.slow_seconds,
        burst_window_seconds=ns.burst_window_seconds,
        page_cap=ns.page_cap,
        empty_pages=ns.empty_pages,
        null_update_time=ns.null_update_time,
        archive_flip=ns.archive_flip,
        hostile_mail=ns.hostile_mail,
        private_mail=ns.private_mail,
        forbidden_fanout=ns.forbidden_fanout,
        private_deal_mail=ns.private_deal_mail,
        long_notes=ns.long_notes,
        live_rate=ns.live_rate,
        live_max=ns.live_max,
        live_mix=ns.live_mix,
    )


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground until interrupted; exit 2 with argparse's message for a bad option."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        config = config_from_args(ns)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        serve(config, ns.port, ns.host)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
