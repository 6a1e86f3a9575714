"""Authentication of what crosses Redis: HMAC-SHA256 under a fleet key, with key ids.

Who holds the key: every worker and every producer of one fleet (the same key: HMAC
is symmetric, so a producer could also forge a result; producers are trusted
clients). Redis, and anyone who can only read or write Redis, does not: with the
key set, a forged task is dropped unread, and a forged or replayed result, saved
verdict (partial) or cache entry is ignored and graded again.

What is signed, each under its own purpose so that no tag is valid elsewhere:

    task     job id, batch id, items digest, options   (producer -> worker)
    result   job id, batch id, items digest, verdicts  (worker -> producer)
    partial  batch id, items digest, index, verdict    (worker -> a later delivery)
    cache    cache key digest, entry                   (worker -> any worker)

The items digest (`items_digest`) is the SHA-256 of the items' JSON text as stored:
it binds ids to the exact rollouts, so a message carrying a victim's ids with other
items cannot answer (or pre-fill) the victim's batch.

Rotation: a keyring holds several keys; the first signs, every one verifies. Give
every node the new key second, then first, then drop the old one. A tag names its
key by id (the first 8 hex digits of the key's SHA-256), so no key is tried blindly.
Pure stdlib.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from workers.errors import ConfigError
from workers.wire.urls import read_secret

__all__ = ["MIN_KEY_BYTES", "Keyring", "items_digest", "keyring_from_env"]

MIN_KEY_BYTES = 32
_KEY_ID_CHARS = 8


def items_digest(items_json: bytes | str) -> str:
    """SHA-256 hex of a batch's items JSON text (as the producer stores it)."""
    data = (
        items_json.encode("utf-8", "surrogatepass")
        if isinstance(items_json, str)
        else items_json
    )
    return hashlib.sha256(data).hexdigest()


def _frame(purpose: str, parts: Sequence[str | bytes]) -> bytes:
    """Length-prefixed parts: no two different part lists frame the same bytes."""
    chunks = [purpose.encode(), b"\0"]
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        chunks += [len(data).to_bytes(8, "big"), data]
    return b"".join(chunks)


class Keyring:
    """The fleet's signing keys: `keys[0]` signs, every key verifies.

    Raises:
        ConfigError: no key, or a key shorter than `MIN_KEY_BYTES`.
    """

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ConfigError("a keyring needs at least one key")
        if any(len(key) < MIN_KEY_BYTES for key in keys):
            raise ConfigError(f"signing keys must be at least {MIN_KEY_BYTES} bytes")
        self._by_id = {self._key_id(key): key for key in keys}
        self.signing_id = self._key_id(keys[0])
        self._signing_key = keys[0]

    @classmethod
    def from_text(cls, text: str) -> Keyring:
        """Keys one per line (blank lines and `#` comments skipped), first signs."""
        lines = [line.strip() for line in text.splitlines()]
        keys = [line.encode() for line in lines if line and not line.startswith("#")]
        return cls(keys)

    @staticmethod
    def _key_id(key: bytes) -> str:
        return hashlib.sha256(key).hexdigest()[:_KEY_ID_CHARS]

    def __repr__(self) -> str:  # never the keys themselves
        return f"Keyring(signing_id={self.signing_id!r}, keys={len(self._by_id)})"

    def sign(self, purpose: str, *parts: str | bytes) -> str:
        """The tag `<key id>:<hex HMAC>` of `parts` for `purpose`."""
        mac = hmac.new(self._signing_key, _frame(purpose, parts), hashlib.sha256)
        return f"{self.signing_id}:{mac.hexdigest()}"

    def verify(self, tag: object, purpose: str, *parts: str | bytes) -> bool:
        """True when `tag` is a valid tag of `parts` under any key of this ring."""
        if not isinstance(tag, str):
            return False
        key_id, _, mac_hex = tag.partition(":")
        key = self._by_id.get(key_id)
        if key is None:
            return False
        mac = hmac.new(key, _frame(purpose, parts), hashlib.sha256)
        return hmac.compare_digest(mac.hexdigest(), mac_hex)


def keyring_from_env(env: Mapping[str, str]) -> Keyring | None:
    """The fleet keyring from `GRADEFLEET_SIGNING_KEY` or the file named by
    `GRADEFLEET_SIGNING_KEY_FILE`; None when neither is set. For entry points (the
    worker's settings and the producer CLI read the same variables)."""
    text = read_secret(env, "GRADEFLEET_SIGNING_KEY")
    return None if text is None else Keyring.from_text(text)
