"""The options values and the keywords that build them: one set of names, one set of defaults."""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

import pytest

from reconcile.core.contract import ConfigurationError
from reconcile.ha.options import HaKeywords, HaOptions
from reconcile.recovery.modes import Mode
from reconcile.recovery.options import RecoverKeywords, RecoverOptions
from reconcile.spark.options import (
    SparkRecoverKeywords,
    SparkRecoverOptions,
    StreamKeywords,
    StreamOptions,
)
from sinks.postgres.options import PostgresKeywords, PostgresOptions

PAIRS: list[tuple[Any, Any]] = [
    (PostgresOptions, PostgresKeywords),
    (StreamOptions, StreamKeywords),
    (HaOptions, HaKeywords),
    (RecoverOptions, RecoverKeywords),
    (SparkRecoverOptions, SparkRecoverKeywords),
]


@pytest.mark.parametrize("options, keywords", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_every_option_is_a_keyword_and_only_those_without_a_default_are_required(
    options: Any, keywords: Any
) -> None:
    fields = {f.name: f for f in dataclasses.fields(options)}
    assert set(get_type_hints(keywords)) == set(fields)
    no_default = {
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert set(keywords.__required_keys__) == no_default


def test_an_options_value_is_frozen() -> None:
    options = PostgresOptions(key=["id"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.append_only = True  # type: ignore[misc]
    assert options.key_columns == ("id",)
    assert PostgresOptions().key_columns is None


def test_recover_options_name_a_bad_mode_and_build_the_brake() -> None:
    assert RecoverOptions(mode="SCOPED").chosen_mode() is Mode.SCOPED
    with pytest.raises(ConfigurationError, match=r"mode must be one of .* got 'fast'"):
        RecoverOptions(mode="fast").chosen_mode()
    brake = RecoverOptions(max_change_fraction=0.25, allow_mass_change=True).brake()
    assert brake.allow_mass_change and brake.limit(100) == 25
    with pytest.raises(ConfigurationError, match="max_change_fraction"):
        RecoverOptions(max_change_fraction=2).brake()
