"""The HTTP options schema carries every verdict-changing `GradeOptions` field, and
the lane."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from producer.serve.schemas import OptionsIn
from workers.models import GradeOptions


def test_options_schema_has_every_grade_option() -> None:
    fields = {field.name for field in dataclasses.fields(GradeOptions)}
    # `priority` picks the fleet lane; it is not a verdict-changing option.
    assert set(OptionsIn.model_fields) == fields | {"priority"}


def test_options_schema_round_trips_non_defaults() -> None:
    options = GradeOptions(allow_fallback=False, approximate=True, rel_tol=1e-3)
    assert OptionsIn(**options.to_dict()).to_options() == options
    assert OptionsIn().to_options() == GradeOptions()


def test_options_schema_priority_defaults_to_interactive() -> None:
    assert OptionsIn().priority == "interactive"
    assert OptionsIn(priority="bulk").priority == "bulk"
    with pytest.raises(ValidationError):
        OptionsIn(priority="urgent")
