"""The chart's sharded Prometheus adapters: `ingest.prometheus.shards: N` renders N Deployments,
shard i of N each (sources.prometheus_shard), with selectors that do not overlap, so each pod
keeps its own position; one shard (the default) renders the single Deployment as before."""

from __future__ import annotations

from typing import Any

from tests.integration.test_kubernetes_helm import _pod, render

ON = ["--set", "ingest.prometheus.enabled=true"]


def _adapters(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs
            if d["kind"] == "Deployment" and "ingest-prometheus" in d["metadata"]["name"]}  # fmt: skip


def _env(doc: dict[str, Any]) -> dict[str, str]:
    (container,) = _pod(doc)["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_n_shards_are_n_adapters_on_disjoint_shards(helm: str) -> None:
    docs = render(helm, "fp", "fleet", *ON, "--set", "ingest.prometheus.shards=4",
                  "--set", "ingest.prometheus.nodesPerQuery=250")  # fmt: skip
    adapters = _adapters(docs)
    assert sorted(adapters) == [f"fp-fleetpulse-ingest-prometheus-{i}" for i in range(4)]
    shards = sorted(_env(d)["FLEETPULSE_SOURCES__PROMETHEUS_SHARD"] for d in adapters.values())
    assert shards == ["0/4", "1/4", "2/4", "3/4"]
    assert {_env(d)["FLEETPULSE_SOURCES__PROMETHEUS_NODES_PER_QUERY"] for d in adapters.values()} \
        == {"250"}
    selectors = [tuple(sorted(d["spec"]["selector"]["matchLabels"].items()))
                 for d in adapters.values()]  # fmt: skip
    assert len(set(selectors)) == 4  # no Deployment adopts another's pod
    for doc in adapters.values():  # each pod carries its own selector's labels
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert doc["spec"]["replicas"] == 1


def test_one_shard_is_the_single_adapter(helm: str) -> None:
    adapters = _adapters(render(helm, "fp", "fleet", *ON))
    assert list(adapters) == ["fp-fleetpulse-ingest-prometheus"]
    env = _env(adapters["fp-fleetpulse-ingest-prometheus"])
    assert "FLEETPULSE_SOURCES__PROMETHEUS_SHARD" not in env
    assert "FLEETPULSE_SOURCES__PROMETHEUS_NODES_PER_QUERY" not in env
