"""`make bench`: the quick benches one after another (each a minute or two on an idle two-core
machine), their output streamed, and every bench's closing RATIOS block repeated at the end.

    python bench/quick.py [--only write_path,task_overhead,entity_path,entity_path_limited,email_phase,requests,fixed_cost]

A bench that fails (non-zero exit) is named at the end and makes this exit non-zero; the others
still run. The seed-customer bench (bench/seed_customer.py) is not quick and not run here.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> arguments: sizes chosen so each runs in a minute or two on an idle machine
QUICK: dict[str, list[str]] = {
    "write_path": ["--rows", "3000", "--orgs", "1500", "--reps", "3"],
    "task_overhead": ["--tasks", "100", "--reps", "3"],
    "entity_path": ["--scale", "small", "--reps", "3"],
    # the same under Pipedrive's burst limit (80 per 2 s), the one the budget keeps to
    "entity_path_limited": ["--scale", "small", "--reps", "3", "--burst-limit", "80"],
    "email_phase": ["--scale", "small", "--latency", "realistic:0.05", "--burst-limit", "600"],
    "requests": ["--scales", "tiny,small,seed"],
    "fixed_cost": ["--scale", "small", "--reps", "3", "--preload"],  # at a terminal (the launcher) and plain
}

SCRIPT = {"entity_path_limited": "entity_path"}  # a name whose script is another's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(QUICK), help="comma list of benches to run")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in QUICK]
    if unknown:
        parser.error(f"unknown bench {', '.join(unknown)}: choose from {', '.join(QUICK)}")
    blocks: list[str] = []
    failed: list[str] = []
    for name in names:
        cmd = [sys.executable, str(HERE / f"{SCRIPT.get(name, name)}.py"), *QUICK[name]]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE.parent)
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip("\n"))
        code = proc.wait()
        seconds = time.monotonic() - started
        start = max((i for i, ln in enumerate(lines) if ln.startswith("RATIOS")), default=None)
        block = lines[start:] if start is not None else [f"RATIOS {name}: none printed"]
        blocks.append("\n".join(block) + f"\n  ({name} took {seconds:.0f} s, exit {code})")
        if code:
            failed.append(f"{name} (exit {code})")
    print("\n==================== all ratios ====================")
    for b in blocks:
        print(b)
    if failed:
        print("FAILED:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
