"""The HTTP options schema carries every verdict-changing `GradeOptions` field."""

from __future__ import annotations

import dataclasses

from producer.schemas import OptionsIn
from workers.models import GradeOptions


def test_options_schema_has_every_grade_option() -> None:
    fields = {field.name for field in dataclasses.fields(GradeOptions)}
    assert set(OptionsIn.model_fields) == fields


def test_options_schema_round_trips_non_defaults() -> None:
    options = GradeOptions(allow_fallback=False, approximate=True, rel_tol=1e-3)
    assert OptionsIn(**options.to_dict()).to_options() == options
    assert OptionsIn().to_options() == GradeOptions()
