"""The gates' verdicts are one vocabulary: every reason a withheld/1 record can carry is a typed
Hold or Dropped, each has its pool alert (or none) and its words, and the schema documents it."""

from __future__ import annotations

from typing import get_args

from pipeline.decide import verdicts, withheld
from pipeline.model import WITHHELD_REASON_DOC


def test_every_hold_has_its_pool_alert_and_every_reason_is_documented() -> None:
    holds, dropped = set(get_args(verdicts.Hold)), set(get_args(verdicts.Dropped))
    assert set(verdicts.WITHHELD_ALERT) == holds
    assert set(withheld._DROPPED) == dropped
    missing = sorted(r for r in holds | dropped if r not in WITHHELD_REASON_DOC)
    assert not missing, f"WITHHELD_REASON_DOC: expected every reason named, missing {missing}"
