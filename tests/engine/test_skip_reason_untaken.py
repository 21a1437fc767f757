"""A placeholder whose parent the source has but the run did not write names the lists of the
parent's kind the run did not take, and the remedy (`skip_reason.UNTAKEN`): the activity of an
archived deal in a run of the active deals alone. Pure words; the whole path, through the command
line on the sandbox, is tests/dagster/test_archived_remedy.py's."""
from __future__ import annotations

from engine_core.rows import Ref
from engine_core.skip_reason import NOT_WRITTEN, not_linked, untaken_lists, untaken_mark

LISTS = {"deals": ("deals", "deals_archived"), "leads": ("leads", "leads_archived")}


def test_the_lists_not_taken_are_those_of_a_kind_the_run_takes_in_part():
    assert untaken_lists(LISTS, ["persons", "deals", "leads", "activities"]) == {
        "deals": ("deals_archived",), "leads": ("leads_archived",)}
    assert untaken_lists(LISTS, ["deals", "deals_archived", "activities"]) == {}  # leads: none taken, none probed
    assert untaken_lists(LISTS, ["deals_archived", "activities"]) == {"deals": ("deals",)}


def test_a_parent_the_source_has_names_the_list_not_taken_and_the_remedy():
    deal = Ref("deal_id", "deals", "784", lookup=("deals", "deals_archived"), noun="deal")
    person = Ref("contact_id", "persons", "12", noun="person")
    exists = {("deals", "784"): True, ("persons", "12"): True}
    untaken = untaken_lists(LISTS, ["persons", "deals", "activities"])
    said = not_linked([deal, person], exists, untaken=untaken)
    assert said == (f"not linked to any record: deal 784 {NOT_WRITTEN} - {untaken_mark('deals_archived')}: a run of "
                    f"`--kinds deals_archived`, then `migrate sync`, links it; person 12 {NOT_WRITTEN}"), said
    # every list taken: the reason is what it was
    assert not_linked([deal], exists, untaken={}) == f"not linked to any record: deal 784 {NOT_WRITTEN}"
