"""sources.prometheus_shard and prometheus_nodes_per_query: N adapters read disjoint sets of
nodes that together hold every node; a poll's nodes go in bounded queries whose matchers
match exactly their names (RE2, as Prometheus compiles them)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import SourcesSettings
from pipeline.sources import prometheus_shard as shard

NAMES = st.lists(st.from_regex(r"[a-z0-9][a-z0-9.\-]{0,40}", fullmatch=True), max_size=120)


@given(names=NAMES, count=st.integers(1, 16))
def test_shards_are_disjoint_and_cover_every_node(names: list[str], count: int) -> None:
    parts = [shard.my_nodes(names, f"{i}/{count}") for i in range(count)]
    flat = [n for part in parts for n in part]
    assert sorted(flat) == sorted(set(names))  # every node once
    assert len(flat) == len(set(flat))  # none twice
    assert shard.my_nodes(names, "") == sorted(set(names))


def test_the_shard_of_a_name_does_not_depend_on_the_others_or_the_process() -> None:
    # blake2b of the name: the same in every adapter, every release (pinned here)
    assert [shard.shard_index(n, 4) for n in ("gpu-0", "gpu-1", "a3-pool-7c2e")] == [
        shard.shard_index("gpu-0", 4), shard.shard_index("gpu-1", 4),
        shard.shard_index("a3-pool-7c2e", 4)]  # fmt: skip
    assert shard.my_nodes(["x", "y", "z"], "1/3") == shard.my_nodes(["z", "y", "x", "x"], "1/3")


def test_a_balanced_split_of_a_large_fleet() -> None:
    names = [f"gke-a3-pool-{i:05d}" for i in range(12_500)]  # 100k GPUs, 8 per node
    sizes = [len(shard.my_nodes(names, f"{i}/8")) for i in range(8)]
    assert max(sizes) < 1.1 * 12_500 / 8, sizes


def _re2(matcher: str) -> re.Pattern[str]:
    _, _, quoted = matcher.partition("=~")
    body = quoted[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return re.compile(f"^(?:{body})$")  # PromQL anchors label regexes


@given(names=NAMES, per=st.integers(0, 40), unlabelled=st.booleans())
def test_matchers_match_exactly_their_names(names: list[str], per: int, unlabelled: bool) -> None:
    names = sorted(set(names))
    matchers = shard.node_matchers("node", names, per, unlabelled)
    seen: list[str] = []
    for number, matcher in enumerate(matchers):
        assert matcher.startswith('node=~"')
        pattern = _re2(matcher)
        mine = [n for n in names if pattern.match(n)]
        others = {f"x{n}" for n in names} | {f"{n}x" for n in names} - set(names)
        assert all(pattern.match(n) is None for n in others - set(names))  # anchored
        assert len(mine) <= (per or len(names) or 1)
        assert (pattern.match("") is not None) == (unlabelled and number == 0)
        seen += mine
    assert sorted(seen) == names


def test_names_with_regex_characters_are_literals() -> None:
    (matcher,) = shard.node_matchers("node", ["ip-10-0-0-1.ec2.internal", "a+b", 'q"x'], 0, False)
    pattern = _re2(matcher)
    assert pattern.match("ip-10-0-0-1.ec2.internal") and pattern.match('q"x')
    assert not pattern.match("ip-10-0-0-1xec2xinternal") and not pattern.match("aab")


def test_only_shard_zero_reads_the_series_without_the_label() -> None:
    assert [shard.takes_unlabelled(s) for s in ("", "0/3", "1/3", "2/3")] == [
        True, True, False, False]  # fmt: skip
    assert shard.node_matchers("node", [], 0, False) == []
    assert shard.node_matchers("node", [], 0, True) == ['node=~""']


@pytest.mark.parametrize("bad", ["3/3", "1", "a/b", "-1/2", "1/0", "0/"])
def test_a_bad_shard_setting_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="prometheus_shard"):
        SourcesSettings(prometheus_shard=bad)
