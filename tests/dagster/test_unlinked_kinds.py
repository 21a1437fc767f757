"""A run of chosen kinds whose rows link only to kinds neither the run takes nor the tenant holds is
told so at launch (`launch.checks.unlinked_kinds`): `--kinds emails` on a new tenant listed every
deal's mail and landed no message, each skipped "not linked", with nothing said before."""
from __future__ import annotations

from engine_core.providers.registry import provider_for
from migration_pipeline.launch.checks import unlinked_kinds


def test_a_kind_without_its_parents_is_named_with_the_kinds_to_add() -> None:
    pipedrive = provider_for("pipedrive")
    note = unlinked_kinds(pipedrive, ["emails"], held=[])
    assert note and "emails link to deals" in note and "--kinds deals,emails" in note, note
    note = unlinked_kinds(pipedrive, ["persons", "deals"], held=[])
    assert note and "persons link to organizations" in note and "deals link" not in note, note
    assert "--kinds organizations,persons,deals" in note, note


def test_parents_taken_held_or_defaults_say_nothing() -> None:
    pipedrive = provider_for("pipedrive")
    assert unlinked_kinds(pipedrive, ["emails"], held=["deals"]) is None  # an earlier run brought them
    assert unlinked_kinds(pipedrive, ["organizations", "persons"], held=[]) is None
    assert unlinked_kinds(pipedrive, ["+deal_history"], held=[]) is None  # the defaults take every parent
    assert unlinked_kinds(pipedrive, None, held=[]) is None
