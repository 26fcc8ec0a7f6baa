"""The Cloud Monitoring stand-in's filter reader accepts what the API accepts, refuses the rest."""

from __future__ import annotations

import pytest

from pipeline.sim.endpoints.cloud_monitoring import Condition, FilterError, parse_filter

DUTY = "tpu.googleapis.com/accelerator/duty_cycle"


def test_metric_type_and_label_conditions() -> None:
    metric_type, conditions = parse_filter(
        f'metric.type = "{DUTY}" AND resource.labels.location = "us-east5-a" '
        'AND metric.label.accelerator_id != "123-0" AND resource.type="tpu_worker"'
    )
    assert metric_type == DUTY
    assert conditions[1:] == [
        Condition("resource.labels.location", True, "us-east5-a"),
        Condition("metric.labels.accelerator_id", False, "123-0"),
        Condition("resource.type", True, "tpu_worker"),
    ]


def test_escaped_quotes_in_values() -> None:
    _, conditions = parse_filter(f'metric.type = "{DUTY}" AND metric.labels.k = "a\\"b"')
    assert conditions[1].value == 'a"b'


@pytest.mark.parametrize(
    "text",
    [
        'resource.type = "tpu_worker"',  # no metric.type
        f'metric.type = "{DUTY}" AND metric.type = "{DUTY}"',  # two
        f'metric.type != "{DUTY}"',
        f'metric.type = starts_with("{DUTY}")',  # functions are not supported here
        f'metric.type = "{DUTY}" OR resource.type = "x"',
        f'metric.type = "{DUTY}" AND project = "p"',  # unknown selector
        f"metric.type = '{DUTY}'",  # single quotes
    ],
)
def test_refused_filters(text: str) -> None:
    with pytest.raises(FilterError):
        parse_filter(text)
