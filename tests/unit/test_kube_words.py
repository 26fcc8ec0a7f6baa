"""An action the actuator skips or refuses for its age says how stale it is as a person would."""

from __future__ import annotations

import pytest

from pipeline.kube.defences import in_words


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(40, "40 s"), (119, "119 s"), (720, "12 min"), (5 * 3600, "5 h"), (3 * 86_400, "3 days"),
     (340 * 86_400, "11 months")],
)
def test_durations_in_words(seconds: float, words: str) -> None:
    assert in_words(seconds) == words
