"""A command a line tells the user to type is one the command line takes: verify's takeable and
owed lines, and the remedies `migrate run`/`sync` and `migrate explain` name for rows skipped for a
list the run did not take, are parsed by the `migrate` group itself (click's own parsing, nothing
run). verify's takeable line said `migrate sync --tenant T`, which `migrate sync` refuses (it takes
TENANT as its argument)."""
from __future__ import annotations

import re

import click

from engine_core.verify import KindResult, VerifyResult
from migration_pipeline.cli.main import main
from migration_pipeline.cli.remedy import take_lists


def _parses(command: str) -> None:
    words = command.split()
    assert words[0] == "migrate", command
    name, args = words[1], words[2:]
    sub = main.commands[name]
    try:
        sub.make_context(name, list(args), resilient_parsing=False)
    except click.UsageError as e:
        raise AssertionError(f"`{command}` is refused by the command line: {e.format_message()}") from None


def test_the_commands_verify_says_are_taken_by_the_command_line():
    kind = KindResult("participants", ("participants",), source=2, ledger=2, product=1, unwritten=1, skipped=1,
                      takeable=["7"], owed_to={"users": ["3"]})
    said = [c for line in VerifyResult("acme", "pipedrive", [kind]).lines() for c in re.findall(r"`(migrate [^`]+)`", line)]
    assert any(c.startswith("migrate sync") for c in said) and any(c.startswith("migrate run") for c in said), said
    for command in said:
        _parses(command)


def test_the_remedy_for_rows_waiting_on_a_list_not_taken_parses():
    _parses(take_lists("acme", ["deals_archived", "leads_archived"]))
    _parses("migrate sync acme")
