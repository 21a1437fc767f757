"""A mapped value Postgres cannot hold: NUL anywhere in a jsonb value (a key, a nested text, a
list's text, a Mapping or tuple that is not a dict or list) makes the row malformed; everything
else passes (`mapping._no_nul`, walked without recursion)."""
from __future__ import annotations

from collections import OrderedDict
from types import MappingProxyType

import pytest

from engine_core.providers.pipedrive.fields import FieldDef, custom_value
from engine_core.providers.pipedrive.mapping import MalformedRow, _no_nul


class Text(str):
    pass


@pytest.mark.parametrize("value", [
    "a\x00", {"k\x00": 1}, {"k": {"deeper": ["x", "y\x00"]}}, ("ok", "\x00"), [[[Text("t\x00")]]],
    MappingProxyType({"k": "v\x00"}), OrderedDict(a=[{"b": "\x00"}]),
])
def test_nul_anywhere_is_malformed(value) -> None:
    with pytest.raises(MalformedRow, match="^custom field 'F' contains NUL bytes$"):
        _no_nul(value, "custom field 'F'")


def test_values_without_nul_pass_and_a_custom_value_is_checked() -> None:
    _no_nul({"a": [1, 2.5, True, None, "x", ("y", {"z": Text("w")})], "b": MappingProxyType({"c": "d"})}, "f")
    with pytest.raises(MalformedRow, match="custom field 'Colour' contains NUL bytes"):
        custom_value(FieldDef("deal", "k1", "Colour", "varchar"), {"value": "red\x00"})
    assert custom_value(FieldDef("deal", "k1", "Colour", "varchar"), "red")["value"] == "red"
