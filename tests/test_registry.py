"""_registry.py: the name -> implementation registry behind stores and codecs."""

from __future__ import annotations

import json

import pytest

from mlcache import RegistryError
from mlcache._registry import Registry


def only_classes(obj: object) -> None:
    if not isinstance(obj, type):
        raise TypeError(f"{obj!r} is not a class")


@pytest.fixture
def reg() -> Registry[type]:
    return Registry("widget", only_classes)


def test_register_and_look_up(reg):
    reg.register("a", int)
    reg.register("b-2.x+y_z", float)
    assert reg["a"] is int and reg["b-2.x+y_z"] is float
    assert "a" in reg and "c" not in reg and 5 not in reg
    assert len(reg) == 2
    assert list(reg) == ["a", "b-2.x+y_z"]  # registration order
    assert dict(reg.items()) == {"a": int, "b-2.x+y_z": float}


def test_it_is_read_only_as_a_mapping(reg):
    reg.register("a", int)
    with pytest.raises(TypeError):
        reg["b"] = float  # type: ignore[index]
    with pytest.raises((TypeError, AttributeError)):
        del reg["a"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["", "A", "has space", "1x", "-x", "a/b", "é", "x" * 65, None, 3])
def test_bad_names_are_refused_with_what_was_expected(reg, name):
    with pytest.raises(RegistryError, match="invalid widget name") as info:
        reg.register(name, int)
    assert "lowercase" in str(info.value)
    assert isinstance(info.value, LookupError)


def test_a_name_is_registered_once_unless_replaced(reg):
    reg.register("a", int)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a", float)
    assert reg["a"] is int
    reg.register("a", float, replace=True)
    assert reg["a"] is float


def test_invalid_implementation_is_a_registry_error(reg):
    with pytest.raises(RegistryError, match="cannot register widget 'a'.*not a class"):
        reg.register("a", 42)
    assert "a" not in reg


def test_unknown_name_lists_the_known_ones(reg):
    with pytest.raises(RegistryError, match="unknown widget 'x'; known: none"):
        reg["x"]
    reg.register("a", int)
    reg.register("b", float)
    with pytest.raises(RegistryError, match="known: a, b"):
        reg["x"]
    with pytest.raises(RegistryError):
        reg[["unhashable"]]  # type: ignore[index]


def test_lazy_entries_are_imported_on_first_use(reg):
    reg.register("decoder", "json:JSONDecoder")
    assert "decoder" in reg
    assert reg["decoder"] is json.JSONDecoder
    assert reg["decoder"] is json.JSONDecoder


def test_lazy_entry_of_a_missing_module_shows_the_install_hint(reg):
    reg.register("fancy", "no_such_module_mlcache:Thing", hint="pip install mlcache[fancy]")
    with pytest.raises(RegistryError, match=r"not available.*pip install mlcache\[fancy\]"):
        reg["fancy"]
    reg.register("plain", "no_such_module_mlcache:Thing")
    with pytest.raises(RegistryError, match="not available") as info:
        reg["plain"]
    assert "install it with" not in str(info.value)


def test_lazy_entry_of_a_missing_attribute_is_a_registry_error(reg):
    reg.register("gone", "json:NoSuchThing")
    with pytest.raises(RegistryError, match="gone"):
        reg["gone"]


def test_lazy_entry_that_is_not_a_valid_implementation_is_a_registry_error(reg):
    reg.register("func", "json:dumps")  # a function, not a class
    with pytest.raises(RegistryError, match="func"):
        reg["func"]
