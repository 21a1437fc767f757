"""Behaviour 1: the plan is data; a run limited to some kinds has only the phases it needs."""
from __future__ import annotations

import pytest

from engine_core import runs
from engine_core.errors import ConfigError
from engine_core.plan import choose_kinds, left_out, left_out_line, plan_for
from engine_core.providers.registry import provider_for
from engine_core.providers.pipedrive.plan import PHASES as PIPEDRIVE_PHASES
from tests.engine.support import FAST


def test_plan_for_limits_to_kinds_and_drops_empty_phases() -> None:
    phases = [["a", "b"], ["c"], ["d"], ["e"]]
    assert plan_for(phases) == phases
    assert plan_for(phases, ["d", "b"]) == [["b"], ["d"]]


def test_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="zebras"):
        plan_for([["a"]], ["zebras"])


def test_notes_and_activities_only_run_has_two_phases(db) -> None:
    run = runs.start_run(db, provider_for("example"), "t1", kinds=["notes", "activities"], settings=FAST)
    assert [list(g) for g in run.plan] == [["activities"], ["notes"]]
    assert {r["phase"] for r in db.sql("SELECT DISTINCT phase FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})} == {0}
    assert plan_for(PIPEDRIVE_PHASES, ["notes", "activities"]) == [["activities"], ["notes"]]


PHASES = [["users"], ["persons", "files"], ["deals"], ["deal_history", "participants"], ["catchup"]]
OPT_IN = {"files", "deal_history", "participants"}


def test_no_choice_takes_the_default_kinds_and_leaves_the_opt_in_ones_out() -> None:


    assert choose_kinds(PHASES, None) is None  # no opt-in kind: every kind, as before
    taken = choose_kinds(PHASES, None, OPT_IN)
    assert taken == ["users", "persons", "deals", "catchup"]
    left = left_out(PHASES, taken, OPT_IN)
    assert left == {"files": "opt-in", "deal_history": "opt-in", "participants": "opt-in"}
    # short lines, what was left out and how to add it: one had run on past any terminal's width
    assert left_out_line(left) == ("left out: files, deal_history, participants (opt-in: taken only when asked)\n"
                                   "to add them: a run of those kinds alone, --kinds files,deal_history,participants\n"
                                   "or in the Dagster launchpad: resources.new_run.config.kinds: "
                                   "[files, deal_history, participants]")
    assert "to add it: a run of that kind alone, --kinds files\n" in left_out_line({"files": "opt-in"})
    assert left_out_line({}) is None


def test_plus_and_minus_adjust_the_defaults_and_plain_names_are_exactly_those() -> None:


    assert choose_kinds(PHASES, ["+deal_history"], OPT_IN) == ["users", "persons", "deals", "deal_history", "catchup"]
    assert choose_kinds(PHASES, ["+all", "-files"], OPT_IN) == [k for g in PHASES for k in g if k != "files"]
    assert choose_kinds(PHASES, ["-persons"], OPT_IN) == ["users", "deals", "catchup"]
    assert choose_kinds(PHASES, ["deals", "participants"], OPT_IN) == ["deals", "participants"]
    assert choose_kinds(PHASES, ["all"], OPT_IN) == [k for g in PHASES for k in g]
    left = left_out(PHASES, ["deals", "participants"], OPT_IN)
    assert left_out_line(left) == ("left out: files, deal_history (opt-in: taken only when asked); users, persons, catchup "
                                   "(not chosen)\nto add them: a run of those kinds alone, --kinds files,deal_history\n"
                                   "or in the Dagster launchpad: resources.new_run.config.kinds: [files, deal_history]\n"
                                   "to add users, persons, catchup: a run without --kinds (or the UI's Materialize) takes "
                                   "the default kinds the tenant lacks; links owed to them are filled by "
                                   "that run")


@pytest.mark.parametrize("choice, needles", [
    (["+histroy", "+particpants"], ("unknown kinds 'histroy', 'particpants'", "deal_history")),
    (["deals", "+files"], ("deals and +files", "not both")),
    (["-all"], ("leave no kind",)),
    # a typo is named before the mixing rule: the rule's message would send the user the wrong way
    (["+participants", "bogus"], ("unknown kind 'bogus'", "deal_history, participants, catchup, all")),
    (["+participants", "-participants"], ("participants is both added and removed",)),
])
def test_a_bad_choice_is_one_line_naming_what_was_wrong(choice, needles) -> None:


    with pytest.raises(ConfigError) as e:
        choose_kinds(PHASES, choice, OPT_IN)
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)
