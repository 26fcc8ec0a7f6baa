"""Deterministic ids: the same content and episode always give the same id.

A replay after a crash re-emits identical ids, so consumers drop duplicates and at-least-once
delivery becomes effectively-once.
"""

from __future__ import annotations

import hashlib


def stable_id(prefix: str, *parts: object) -> str:
    """`prefix-<16 hex>` from the parts' text; parts are joined unambiguously."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        text = str(part).encode()
        digest.update(len(text).to_bytes(4, "big"))
        digest.update(text)
    return f"{prefix}-{digest.hexdigest()}"
