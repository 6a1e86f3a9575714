"""workers.wire.signing: tags bind purpose and every part; rotation by key id."""

from __future__ import annotations

import pytest

from workers.errors import ConfigError
from workers.verifier import grade
from workers.wire.protocol import result_rejection, result_to_wire
from workers.wire.signing import Keyring, items_digest

OLD = "old-key-0123456789abcdef0123456789ab"
NEW = "new-key-0123456789abcdef0123456789ab"


def test_signing_tag_binds_purpose_and_each_part() -> None:
    ring = Keyring.from_text(OLD)
    tag = ring.sign("partial", "b.0", "digest", "3", "{}")
    assert ring.verify(tag, "partial", "b.0", "digest", "3", "{}")
    assert not ring.verify(tag, "cache", "b.0", "digest", "3", "{}")
    assert not ring.verify(tag, "partial", "b.0", "digest", "4", "{}")
    # length-prefixed: moving a boundary between parts changes the tag
    assert not ring.verify(tag, "partial", "b.0d", "igest", "3", "{}")
    assert not ring.verify(None, "partial", "b.0", "digest", "3", "{}")
    assert not ring.verify("zz:00", "partial", "b.0", "digest", "3", "{}")


def test_signing_rotation_first_key_signs_all_verify() -> None:
    old, both = Keyring.from_text(OLD), Keyring.from_text(f"{NEW}\n# old\n{OLD}\n")
    new_only = Keyring.from_text(NEW)
    assert both.verify(old.sign("task", "x"), "task", "x")
    assert old.verify(both.sign("task", "x"), "task", "x") is False
    assert new_only.verify(both.sign("task", "x"), "task", "x")
    assert "key" not in repr(both).replace("keys", "")


def test_signing_rejects_short_or_missing_keys() -> None:
    with pytest.raises(ConfigError):
        Keyring.from_text("short")
    with pytest.raises(ConfigError):
        Keyring.from_text("\n# nothing\n")


def test_signing_result_rejection_checks_ids_digest_and_mac() -> None:
    ring = Keyring.from_text(OLD)
    pairs = [(0, grade("\\boxed{1}", "1")), (1, grade("\\boxed{2}", "1"))]
    digest = items_digest('[{"index": 0}]')
    wire = dict(
        result_to_wire(
            job_id="j", batch_id="j.0", results=pairs, items_digest=digest, keyring=ring
        )
    )
    ok = {"job_id": "j", "batch_id": "j.0", "items_digest": digest}
    assert result_rejection(wire, **ok, keyring=ring) is None
    assert result_rejection(wire, **ok, keyring=None) is None
    assert result_rejection(wire, **{**ok, "batch_id": "j.1"}, keyring=ring)
    assert result_rejection(wire, **{**ok, "job_id": "k"}, keyring=ring)
    assert result_rejection(wire, **{**ok, "items_digest": "0" * 64}, keyring=None)
    flipped = [dict(r) for r in wire["results"]]
    flipped[1] = {**flipped[1], "verdict": {**flipped[1]["verdict"], "correct": True}}
    assert result_rejection({**wire, "results": flipped}, **ok, keyring=ring)
    unsigned = {k: v for k, v in wire.items() if k != "mac"}
    assert result_rejection(unsigned, **ok, keyring=ring)
