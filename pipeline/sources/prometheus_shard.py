"""Which nodes one Prometheus adapter reads, and in how many queries (sources.prometheus_shard,
sources.prometheus_nodes_per_query). Pure: names in, label matchers out.

At 100k GPUs one query over every DCGM series returns ~3 M series (1-1.6 GB of JSON per poll):
no one process should decode that as one document. The adapter first asks Prometheus for the
node names that have DCGM series in the poll's window (the label-values API, an index lookup),
keeps those of its shard and reads them in queries of at most `nodes_per_query` nodes, each a
`<node label>=~"n1|n2|…"` matcher added to the series selector. A node's series all come back
in one response, so a node's scrape is still one sample.

- Shard "i/N": a node belongs to shard `blake2b(name) mod N`, a function of the name alone,
  so N adapters with i = 0..N-1 read disjoint sets that together hold every node, however
  each one's window or listing differs: no GPU is read twice, none is missed.
- Series without the node label (an exporter that has no such label, a scrape config that
  does not relabel it) match the empty alternative, which only shard 0's first query carries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pipeline.config import shard_of

# RE2 metacharacters to escape in a node name; PromQL's string then escapes `\` and `"`
_RE2_SPECIAL = frozenset(r"\.+*?()|[]{}^$")


def shard_index(name: str, count: int) -> int:
    """The shard (0..count-1) a node name belongs to: stable across processes and releases."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def my_nodes(names: Iterable[str], shard: str) -> list[str]:
    """The names of `shard` ("i/N"; "" = every name), sorted."""
    where = shard_of(shard) if shard else None
    if where is None:
        return sorted(set(names))
    index, count = where
    return sorted({n for n in names if shard_index(n, count) == index})


def takes_unlabelled(shard: str) -> bool:
    """Whether this shard reads the series that lack the node label (shard 0, or no shard)."""
    where = shard_of(shard) if shard else None
    return where is None or where[0] == 0


def node_matchers(
    label: str, names: list[str], per_query: int, unlabelled: bool
) -> list[str]:
    """One `label=~"…"` matcher per query: `names` in groups of `per_query` (0: one group),
    the first one also matching series without the label when `unlabelled`."""
    size = per_query or max(1, len(names))
    groups = [names[i : i + size] for i in range(0, len(names), size)] or [[]]
    out = []
    for number, group in enumerate(groups):
        alternatives = [_re2_literal(n) for n in group]
        if unlabelled and number == 0:
            alternatives.append("")  # matches a series that lacks the label
        if alternatives:
            out.append(f'{label}=~"{_promql_string("|".join(alternatives))}"')
    return out


def _re2_literal(name: str) -> str:
    return "".join(f"\\{c}" if c in _RE2_SPECIAL else c for c in name)


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
