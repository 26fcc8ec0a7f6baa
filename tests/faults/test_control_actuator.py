"""The Kubernetes actuator as an attacker and a careful operator meet it (issue 33): the real
broker, the real kube-apiserver, `run_actuator` as `fleetpulse actuate kubernetes` runs it.

- forged removals (old, no expires_at, a pool no node is in) remove nothing, each refused and
  echoed on fleet.events.node;
- a slice drain named after a GPU node pool drains none of it;
- a drain a PodDisruptionBudget blocks does not delay another node's cordon, and the offsets
  are committed only once both outcomes are known;
- an action the API server refuses for good is dead-lettered after bounded tries, and the
  action behind it on the same partition is carried out;
- a person who uncordons a node during its drain gets the node back, every mark cleared.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import msgspec
import pytest
from kafka import KafkaConsumer, KafkaProducer

from pipeline.config import KubernetesSettings, Settings
from pipeline.kube import nodes
from pipeline.kube.actuator import Actuator, ActuatorStats
from pipeline.kube.kafka import ActuatorSink, Producer, run_actuator
from pipeline.model import Action, DeadLetter, NodeEvent, Target
from pipeline.wire import codec
from pipeline.wire.admin import create_topics
from pipeline.wire.edge import EdgeStats
from pipeline.wire.topics import topic_name
from tests.faults.reliability import record
from tests.integration.test_kubernetes_actuator import CLUSTER, action, slice_action
from tests.kube_fixture import PLACE, Kube, kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kafka
DRAIN_TIMEOUT_S = 8.0


@pytest.fixture
def setup(settings: Settings, kube: Kube) -> Settings:  # noqa: F811
    k8s = KubernetesSettings(kubeconfig=kube.kubeconfig, cluster=CLUSTER,
                             drain_timeout_s=DRAIN_TIMEOUT_S, eviction_backoff_initial_s=0.2,
                             eviction_backoff_max_s=0.5, api_rejections=3)  # fmt: skip
    ready = msgspec.structs.replace(settings, kubernetes=k8s)
    create_topics(ready.kafka)
    return ready


def _send(settings: Settings, actions: list[tuple[str, Action]]) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    topic = topic_name(settings.kafka, "actions")
    for key, act in actions:
        producer.send(topic, key=key.encode(), value=codec.encode(act)).get(timeout=30)
    producer.close()


def _keyed(act: Action) -> tuple[str, Action]:
    return f"{act.target.cluster}/{act.target.name}", act


def _run(settings: Settings, kube: Kube, group: str,  # noqa: F811
         idle_exit_s: float = 3.0) -> tuple[ActuatorStats, EdgeStats]:  # fmt: skip
    from pipeline.kube.client import connect

    stats, edge = ActuatorStats(), EdgeStats()
    actuator = Actuator(connect(settings.kubernetes).core, settings.kubernetes, CLUSTER,
                        stats=stats)  # fmt: skip
    producer = Producer(settings, f"test-{group}")
    sink = ActuatorSink(actuator, producer.send, settings.kafka.max_value_bytes)
    try:
        run_actuator(settings, group, sink, stop=threading.Event(), idle_exit_s=idle_exit_s,
                     stats=edge)  # fmt: skip
    finally:
        producer.close()
    return stats, edge


def _read(settings: Settings, suffix: str, cls: Any) -> list[Any]:
    consumer = KafkaConsumer(topic_name(settings.kafka, suffix),
                             bootstrap_servers=settings.kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=3000)  # fmt: skip
    try:
        return [codec.decode(r.value, cls) for r in consumer]
    finally:
        consumer.close()


def _removed(kube: Kube, names: list[str]) -> int:  # noqa: F811
    return sum(1 for n in names if kube.core.read_node(n).spec.unschedulable)


def test_forged_drains_remove_nothing(setup: Settings, kube: Kube) -> None:  # noqa: F811
    names = [kube.node() for _ in range(20)]
    for name in names:
        kube.pod(name)
    forged = []
    for name in names:
        target = Target(cluster=CLUSTER, kind="node", name=name, pool="no-such-pool", zone="z-a")
        forged.append(_keyed(action(name, "drain", ts=1_001_894_400_000, expires_at=None,
                                    target=target)))  # fmt: skip
    _send(setup, forged)
    stats, edge = _run(setup, kube, f"g-{uuid.uuid4().hex[:6]}")
    echoes = _read(setup, "events.node", NodeEvent)
    removals = _removed(kube, names)
    refused = sum(1 for e in echoes if e.kind == "refused")
    record("control", "forged drains: 20 actions dated 2001, no expires_at, unknown pool",
           {"removals": removals, "refused": refused})  # fmt: skip
    assert (removals, refused) == (0, 20), [e.reason for e in echoes][:3]
    assert stats.refusals == {"no_expires_at": 20} and edge.records == 20
    assert all(not p.metadata.deletion_timestamp for n in names for p in kube.pods_on(n).values())


def test_a_slice_drain_named_after_a_gpu_pool_drains_none(setup: Settings, kube: Kube) -> None:  # noqa: F811
    pool = f"a3-{uuid.uuid4().hex[:6]}"
    gpus = [kube.node(labels={**PLACE, setup.kubernetes.slice_label: pool,
                              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, gpus=8)
            for _ in range(6)]  # fmt: skip
    drain = slice_action(pool, "drain")
    _send(setup, [_keyed(drain)])
    _run(setup, kube, f"g-{uuid.uuid4().hex[:6]}")
    (echo,) = _read(setup, "events.node", NodeEvent)
    removals = _removed(kube, gpus)
    record("control", "slice drain named after a GPU node pool (6 nodes)",
           {"removals": removals, "refused": int(echo.kind == "refused")})  # fmt: skip
    assert removals == 0 and echo.kind == "refused" and "GPU node" in echo.reason


def test_a_blocked_drain_does_not_delay_the_next_cordon(setup: Settings, kube: Kube) -> None:  # noqa: F811
    blocked, app = kube.node(), f"db-{uuid.uuid4().hex[:6]}"
    kube.pod(blocked, labels={"app": app})
    kube.pdb({"app": app}, allowed=0)
    other = kube.node()
    group = f"g-{uuid.uuid4().hex[:6]}"
    drain = action(blocked, "drain")
    _send(setup, [_keyed(drain)])
    runner = threading.Thread(target=_run, args=(setup, kube, group, 2.0), daemon=True)
    runner.start()
    _until(lambda: kube.core.read_node(blocked).spec.unschedulable, 60, "the drain to start")
    cordon = action(other, "cordon")
    sent = time.monotonic()
    _send(setup, [_keyed(cordon)])
    _until(lambda: kube.core.read_node(other).spec.unschedulable, 60, "the second cordon")
    delay = time.monotonic() - sent
    runner.join(timeout=DRAIN_TIMEOUT_S + 60)
    assert not runner.is_alive()
    echoes = {e.action_id: e.kind for e in _read(setup, "events.node", NodeEvent)}
    record("control", "blocked drain does not delay the next cordon (drain timeout 8 s)",
           {"cordon delay s": round(delay, 2), "drain": echoes.get(drain.action_id, "none")})  # fmt: skip
    assert delay < DRAIN_TIMEOUT_S / 2, f"the cordon waited {delay:.1f} s behind the drain"
    assert echoes == {drain.action_id: "blocked", cordon.action_id: "cordoned"}
    _, again = _run(setup, kube, group, 2.0)
    assert again.records == 0  # both committed once their outcomes were known


def test_a_name_the_api_server_refuses_is_dead_lettered_and_the_rest_go_on(
    setup: Settings, kube: Kube  # noqa: F811
) -> None:
    one = msgspec.structs.replace(setup, kafka=msgspec.structs.replace(
        setup.kafka, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=1))  # fmt: skip
    create_topics(one.kafka)
    name = kube.node()
    bad = slice_action("a:b", "cordon")
    good = action(name, "cordon")
    _send(one, [_keyed(bad), _keyed(good)])
    group = f"g-{uuid.uuid4().hex[:6]}"
    stats, _ = _run(one, kube, group)
    (letter,) = _read(one, "dlq", DeadLetter)
    echoes = [(e.action_id, e.kind) for e in _read(one, "events.node", NodeEvent)]
    record("control", "slice name the API server refuses (a:b), a cordon behind it",
           {"dead letters": 1, "cordons after it": int(kube.core.read_node(name).spec.unschedulable)})  # fmt: skip
    assert letter.reason == "api_rejected" and "HTTP 400" in letter.error
    assert echoes == [(good.action_id, "cordoned")]
    assert stats.refusals == {"api_rejected": 1}
    _, again = _run(one, kube, group, 2.0)
    assert again.records == 0


def test_a_person_who_uncordons_during_a_drain_gets_the_node_back(
    setup: Settings, kube: Kube  # noqa: F811
) -> None:
    name, app = kube.node(), f"db-{uuid.uuid4().hex[:6]}"
    kube.pod(name, labels={"app": app})
    kube.pdb({"app": app}, allowed=0)
    drain = action(name, "drain")
    _send(setup, [_keyed(drain)])
    runner = threading.Thread(target=_run, args=(setup, kube, f"g-{uuid.uuid4().hex[:6]}", 2.0),
                              daemon=True)  # fmt: skip
    runner.start()
    _until(lambda: kube.core.read_node(name).spec.unschedulable, 60, "the drain to start")
    kube.core.patch_node(name, {"spec": {"unschedulable": False}},
                         _content_type="application/merge-patch+json")  # kubectl uncordon
    runner.join(timeout=DRAIN_TIMEOUT_S + 60)
    node = kube.core.read_node(name)
    marks = {"unschedulable": bool(node.spec.unschedulable),
             "taint": any(t.key == nodes.TAINT_KEY for t in node.spec.taints or []),
             "cordoned_by": nodes.CORDONED_BY in (node.metadata.annotations or {})}  # fmt: skip
    (echo,) = _read(setup, "events.node", NodeEvent)
    record("control", "person uncordons during a blocked drain",
           {"marks left": sum(marks.values()), "drain": echo.kind})
    assert marks == {"unschedulable": False, "taint": False, "cordoned_by": False}
    assert echo.kind == "skipped" and "uncordoned by a person" in echo.reason


def _until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(0.05)


def test_well_formed_forged_cordons_stop_at_the_pool_cap(setup: Settings, kube: Kube) -> None:  # noqa: F811
    """A forger who knows the inventory (fresh, expires_at, the right key, pool and zone):
    the actuator's own cap per pool is all that is left, and it holds."""
    names = [kube.node() for _ in range(30)]
    _send(setup, [_keyed(action(name, "cordon")) for name in names])
    stats, _ = _run(setup, kube, f"g-{uuid.uuid4().hex[:6]}")
    removals = _removed(kube, names)
    cap = setup.kubernetes.max_removals_per_pool
    record("control", f"30 well-formed forged cordons in one pool (actuator cap {cap} per pool)",
           {"removals": removals, "refused": stats.refusals.get("cap", 0)})  # fmt: skip
    assert (removals, stats.refusals) == (cap, {"cap": 30 - cap})


def test_node_release_clears_the_marks_and_echoes_a_persons_uncordon(
    setup: Settings, kube: Kube  # noqa: F811
) -> None:
    import os
    import subprocess
    import sys

    name = kube.node()
    kube.pod(name)
    runner = Actuator(kube.core, setup.kubernetes, CLUSTER)
    for kind in ("cordon", "drain", "reboot"):
        runner.handle(action(name, kind))
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": setup.kafka.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": setup.kafka.topic_prefix}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "node", "release", name,
                           "--cluster", CLUSTER, "--kubeconfig", kube.kubeconfig,
                           "--reason", "checked by hand"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    node = kube.core.read_node(name)
    marks = {"unschedulable": bool(node.spec.unschedulable),
             "taint": any(t.key == nodes.TAINT_KEY for t in node.spec.taints or []),
             "repair": nodes.REPAIR_LABEL in (node.metadata.labels or {}),
             "condition": any(c.type == nodes.CONDITION and c.status == "True"
                              for c in node.status.conditions)}  # fmt: skip
    (echo,) = _read(setup, "events.node", NodeEvent)
    record("control", "a person releases a repair-labelled node (fleetpulse node release)",
           {"marks left": sum(marks.values()), "echo": echo.kind})  # fmt: skip
    assert not any(marks.values()), marks
    assert (echo.kind, echo.action_id, echo.target) == ("uncordoned", None, name)
    assert "node release" in echo.actor and "checked by hand" in echo.reason


def test_an_unreachable_api_server_stalls_readiness_not_the_commit(setup: Settings) -> None:
    """Actions that cannot reach the API server are retried in their lanes, never committed,
    and /readyz says so after `stalled_after_s`."""
    from collections import namedtuple

    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "https://127.0.0.1:1"  # nothing listens there
    core = client.CoreV1Api(client.ApiClient(configuration))
    k8s = msgspec.structs.replace(setup.kubernetes, request_timeout_s=0.5)
    sink = ActuatorSink(Actuator(core, k8s, CLUSTER), lambda outs: None,
                        setup.kafka.max_value_bytes, stalled_after_s=1.0)  # fmt: skip
    Record = namedtuple("Record", "topic partition offset key value")
    act = action("n-unreachable", "cordon")
    sink.add(Record("actions", 0, 7, f"{CLUSTER}/n-unreachable".encode(), codec.encode(act)))
    try:
        assert sink.readiness()[0]
        _until(lambda: not sink.readiness()[0], 30, "/readyz to name the stalled target")
        _, why = sink.readiness()
        assert "1 targets' actions failing" in why and "unreachable" in why, why
        assert sink.unsettled() == {("actions", 0): 7} and sink.flush() == []
    finally:
        sink.close()


def test_a_hold_landing_during_a_cordon_wins(setup: Settings, kube: Kube) -> None:  # noqa: F811
    """A person's hold lands between the actuator's read and its patches (both 409): the
    actuator asks again before each attempt, and neither the cordon nor the condition lands."""
    from tests.integration.test_kubernetes_people import HOLD, _PersonFirst

    taken = 0
    for method in ("patch_node_status", "patch_node"):
        name = kube.node()
        core = _PersonFirst(kube, method, name, HOLD)
        echo = Actuator(core, setup.kubernetes, CLUSTER).handle(action(name, "cordon"))
        node = kube.core.read_node(name)
        unhealthy = any(c.type == nodes.CONDITION and c.status == "True"
                        for c in node.status.conditions)  # fmt: skip
        taken += int(bool(node.spec.unschedulable) or unhealthy)
        assert echo is not None and echo.kind == "held", (method, echo)
    record("control", "a person's hold lands during a cordon (before the condition, before "
           "the cordon patch)", {"nodes taken over": taken})  # fmt: skip
    assert taken == 0
