"""The fleet CLI's thread switch interval (`producer.cli._switch_interval`)."""

from __future__ import annotations

import sys

import pytest

from producer.cli import FLEET_SWITCH_INTERVAL_S, _switch_interval


def test_switch_interval_is_set_for_the_block_and_restored():
    before_s = sys.getswitchinterval()
    with _switch_interval(FLEET_SWITCH_INTERVAL_S):
        assert sys.getswitchinterval() == pytest.approx(FLEET_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == before_s
    with pytest.raises(RuntimeError), _switch_interval(FLEET_SWITCH_INTERVAL_S):
        raise RuntimeError("a failed run restores it too")
    assert sys.getswitchinterval() == before_s


def test_no_interval_leaves_it_alone():
    before_s = sys.getswitchinterval()
    with _switch_interval(None):
        assert sys.getswitchinterval() == before_s
