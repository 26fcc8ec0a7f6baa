"""The README's generated paragraphs (bench/prose.py): every figure in them is the result
file's, the goals are judged from the figures, and a missing file or figure reads "not
measured in this checkout" instead of a number."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench import prose

MACHINE = {"date": "2031-01-02", "commit": "abc1234"}


def part(found: int, faults: int, acted: int = 0, withheld: int = 0, *, action: int = 0,
         missed: int | None = None, idle: int = 0, rules: dict[str, int] | None = None,
         named: int | None = None) -> dict[str, Any]:
    return {"found": found, "faults": faults, "acted": acted, "withheld": withheld,
            "action_faults": action, "missed": faults - found if missed is None else missed,
            "found_not_acted": idle, "withheld_rules": rules or {},
            "named": found if named is None else named}


def fleet_run(intensity: float, hard: dict[str, Any]) -> dict[str, Any]:
    return {"intensity": intensity,
            "fleetpulse": {"by_class": {"hard": hard}}, "baseline": {"by_class": {}}}


def detection() -> dict[str, Any]:
    by_type = {
        "F1": part(17, 19),
        "F3": part(3, 3),
        "N1": part(3, 3, 1, 2, action=3, rules={"fleet_cap": 2}),
        "S1": part(24, 26, 3, 17, action=26, idle=4, rules={"budget": 14, "fleet_cap": 3}),
        "G4": part(17, 26, action=26),
        "T2": part(9, 10, action=10),
    }
    fleetpulse = {
        "by_type": by_type,
        "by_class": {"hard": part(194, 204, 48, 127), "gray": part(81, 88),
                     "flapping": part(74, 75)},
        "headline": {"recall_hard": 0.951, "recall_gray": 0.9205, "recall_flapping": 0.9867,
                     "precision": 1.0, "confounder_cordons": 0},
    }
    baseline = {"by_type": {"F1": part(0, 19), "N1": part(1, 3), "S1": part(14, 26)}}
    series = {
        "a/rds_cpu_utilization_cc0c53.csv": {"hits": 1, "windows": 2, "weeks": 2.0},
        "b/machine_temperature_system_failure.csv": {"hits": 3, "windows": 4, "weeks": 11.25},
        "a/ec2_cpu_utilization_5f5533.csv": {"hits": 2, "windows": 2, "weeks": 2.0},
    }
    return {
        "fleet": {
            "intensity": 1000.0, "seeds": [{}, {}, {}, {}],
            "fleetpulse": fleetpulse, "baseline": baseline,
            "by_intensity": {"x10": fleet_run(10.0, part(3, 4, 3, 0)),
                             "x1000": fleet_run(1000.0, part(194, 204, 48, 127))},
        },
        "nab": {
            "sensitivity": 4.5,
            "fleetpulse": {"hits": 6, "windows": 8, "recall": 0.75, "series": 3,
                           "false_alarms_per_week": 1.2714},
            "per_series": series,
            "leave_one_out": {"fleetpulse": {"hits": 5, "windows": 8, "recall": 0.625,
                                             "false_alarms_per_week": 0.766}},
        },
    }


def throughput() -> dict[str, Any]:
    return {"pipeline": {
        "embedded": {"samples_per_core_s": 358558, "runs_cpu_s": [1.0, 2.0, 3.0]},
        "limit": {"samples_per_core_s": 6731895},
        "ratios": {"kafka_pipeline_vs_embedded_per_core": 0.22,
                   "kafka_pipeline_take_vs_per_record_per_core": 1.158,
                   "decode_vs_limit_per_core": 0.127, "embedded_vs_limit_per_core": 0.053,
                   "kafka_pipeline_vs_limit_per_core": 0.012},
    }, "scale": [
        {"gpus": 1000, "state_bytes_per_device": 1315, "rss_bytes_per_device": 2875},
        {"gpus": 10000, "error": "killed"},
        {"gpus": 100000, "state_bytes_per_device": 1325, "rss_bytes_per_device": 2636},
    ]}


def profile() -> dict[str, Any]:
    return {
        "embedded": {"stage_share_of_busy": {"detect_gpu": 0.403, "decode": 0.298,
                                             "policy": 0.001},
                     "rolling_stats_share_of_busy": 0.061},
        "worker": {"component_share_of_busy": {"faust + mode": 0.223, "asyncio": 0.221,
                                               "aiokafka": 0.133, "pipeline: codec": 0.259},
                   "stage_share_of_busy": {"state_tables": 0.041}},
    }


def results(**figures: dict[str, Any] | None) -> dict[str, dict[str, Any] | None]:
    return {name: None if f is None else {"figures": f, "machine": MACHINE}
            for name, f in figures.items()}


def everything() -> dict[str, dict[str, Any] | None]:
    return results(throughput=throughput(), profile=profile(), detection=detection(),
                   latency={"fault_to_action_s": {"p99": 1.3529}},
                   **{"latency-take": {"fault_to_action_s": {"p99": 4.4397}}})


def test_where_the_time_goes_carries_the_result_files_figures() -> None:
    text = prose.time_goes(everything())
    for figure in (
        "358,558 samples/s per core (median of 3 runs",
        "detect_gpu 40 %; decode 30 %",  # largest first
        "(`pipeline/detect/stats.py`, inside the detectors): 6 %",
        "1,315–1,325 B as table state, 2,636–2,875 B of RSS growth",  # the failed size skipped
        "0.22× the embedded runtime's rate",
        "faust, asyncio and aiokafka together: 58 %",  # 22.3 + 22.1 + 13.3
        "the state tables (load, store, encode) 4 %",
        "1.16× the one-at-a-time throughput",
        "p99 4.44 s against 1.35 s one at a time",  # batched first, not swapped
        "6.73 M samples/s per core",
        "decoding alone (msgpack, the producers' default) 0.127×",
        "the worker 0.012×",
        "2031-01-02, commit abc1234",
    ):
        assert figure in text
    assert "policy 0 %" not in text  # a share under 1 % would read as nothing
    assert prose.NOT_MEASURED not in text


def test_the_detection_text_carries_counts_and_judges_the_goals() -> None:
    text = prose.detection_text(everything())
    for figure in (
        "× 10: found 3/4, acted 3, withheld 0; × 1000: found 194/204, acted 48, withheld 127",
        "At × 1000 over 4 seeds",
        "switch and cable failures (F1) 17/19 against 0/19",  # ours, then the baseline's
        "silent link loss (F3) 3/3 against 0/0",  # the baseline has no row: nothing found
        "NIC failures (N1) 3/3 (1 acted, 2 withheld: fleet_cap 2) against 1/3",
        "(3 acted, 17 withheld: budget 14, fleet_cap 3) against 14/26",
        "Not met: hard recall 0.951 (194/204, goal ≥ 0.99)",
        "fabric F1/F3/N1 found 23/25, the failed switch, link or NIC named 23/25 (goal ≥ 0.9 "
        "named)",  # 23/25 = 0.92: met
        "Misses by type: hard: G4 9, F1 2, T2 1; gray: S1 2.",  # most first, by class
        "neither acted on nor withheld (not escalated within the run): S1 4",
        "3 series, 8 windows, 15 series-weeks",
        "6/8 windows found = 0.750 at 1.27 false alarms",
        "is missed by 1 window.",  # 0.85 × 8 = 6.8: 7 needed, 6 found
        "rds_cpu_utilization_cc0c53 1 of 2, machine_temperature_system_failure 1 of 4.",
        "Leave one series out: 0.625 (5/8) at 0.77",
    ):
        assert figure in text, figure
    met, _, not_met = text.partition("Not met:")
    assert "fabric F1/F3/N1" in met and "gray recall 0.920" in met
    assert "hard recall" in not_met and "hard recall" not in met
    assert "ec2_cpu" not in text  # every window of that series found


def test_a_type_scored_in_two_classes_is_named_with_both() -> None:
    by_type = {"G2": part(20, 21), "S3": part(35, 39)}
    sentence = prose.misses_sentence(by_type)
    assert "gray: S3 4; hard or flapping: G2 1." in sentence


def test_goals_change_sides_with_the_figures() -> None:
    fig = detection()
    fig["fleet"]["fleetpulse"]["headline"]["recall_hard"] = 0.995
    fig["fleet"]["fleetpulse"]["by_type"]["F1"] = part(10, 19)  # fabric 16/25 < 0.9
    fig["nab"]["fleetpulse"].update(hits=7, recall=0.875)
    text = prose.detection_text(results(detection=fig))
    met, _, not_met = text.partition("Not met:")
    assert "hard recall 0.995" in met
    assert "fabric F1/F3/N1 found 16/25" in not_met.split(".")[0]
    assert "is met." in text


def test_fabric_faults_found_but_not_named_miss_the_fabric_goal() -> None:
    fig = detection()
    fig["fleet"]["fleetpulse"]["by_type"]["F1"] = part(19, 19, named=10)  # the node, not the link
    met, _, not_met = prose.detection_text(results(detection=fig)).partition("Not met:")
    assert "named 16/25" in not_met.split(". Misses")[0] and "fabric" not in met


@pytest.mark.parametrize("missing", ["throughput", "profile", "latency", "latency-take"])
def test_a_missing_result_file_reads_not_measured(missing: str) -> None:
    given = everything()
    given[missing] = None
    text = prose.time_goes(given)
    assert prose.NOT_MEASURED in text
    gone = {"throughput": "358,558", "profile": "detect_gpu 40 %", "latency": "1.35 s",
            "latency-take": "4.44 s"}[missing]
    assert gone not in text


def test_nothing_measured_has_no_figures_at_all() -> None:
    for name, text in prose.sections({}).items():
        assert prose.NOT_MEASURED in text, name
        words = text.replace("pipeline/detect/stats.py", "").replace("p99", "")
        assert not any(ch.isdigit() for ch in words), text


def test_a_figure_missing_inside_a_file_reads_not_measured() -> None:
    given = everything()
    older = copy.deepcopy(profile())
    del older["embedded"]["rolling_stats_share_of_busy"]  # a profile from before the field
    given["profile"] = {"figures": older, "machine": MACHINE}
    text = prose.time_goes(given)
    assert "(`pipeline/detect/stats.py`, inside the detectors): not measured in this" in text
    assert "detect_gpu 40 %" in text


def test_a_renamed_field_is_reported_not_raised() -> None:
    fig = detection()
    del fig["fleet"]["fleetpulse"]["headline"]
    text = prose.detection_text(results(detection=fig))
    assert "goals_paragraph: result file unreadable (KeyError('headline'))" in text
    assert "17/19 against 0/19" in text  # the other paragraphs still written


def test_the_rolling_statistics_share_counts_the_outermost_frame_once() -> None:
    from types import SimpleNamespace

    from bench.profile import ROLLING_STATS, inside_file

    def frame(path: str | None, time: float, *children: Any) -> Any:
        return SimpleNamespace(file_path=path, time=time, children=list(children))

    stats = f"/src/{ROLLING_STATS}"
    root = frame("/src/bench/profile.py", 10.0,
                 frame("/src/pipeline/detect/gpu.py", 6.0,
                       frame(stats, 2.0, frame(stats, 1.5)),  # a statistic calling another
                       frame(None, 0.5)),  # built-ins have no path
                 frame("/src/pipeline/aggregate.py", 3.0, frame(stats, 0.25)))
    assert inside_file(root, ROLLING_STATS) == 2.25


def test_action_faults_found_and_left_alone_are_a_goal_missed_until_there_are_none() -> None:
    fig = detection()
    fig["fleet"]["fleetpulse"]["by_class"]["gray"] = part(81, 88, idle=3)
    text = prose.goals_paragraph(fig)
    assert "Not met: " in text
    missed = text.split("Not met: ")[1]
    assert "3 action-faults found but neither acted on nor withheld (goal 0)" in missed
    fig["fleet"]["fleetpulse"]["by_class"]["gray"] = part(81, 88)
    met = prose.goals_paragraph(fig).split("Not met: ")[0]
    assert "0 action-faults found but neither acted on nor withheld (goal 0)" in met
