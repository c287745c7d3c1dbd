"""k8s/: the workers' autoscalers and shutdown, checked offline.

Each stage's ScaledObject counts waiting messages (its Redis list) and running stages
(Prometheus's `baton_stages_in_progress`). `settled_replicas` computes, as KEDA's operator and
the HPA do, the replica count a ScaledObject settles on for what its scalers read; the tests
hold it to situations with known answers: busy pods are not drained, a blind scaler falls
back, an idle stage goes to zero. The cooldown and the scale-down stabilization window only
delay a scale-down, so the model leaves time out.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import (
    FIXER_STAGES,
    NAMESPACE,
    SANDBOX_NAMESPACE,
    Doc,
    build,
    container,
    copy_with_example_secrets,
    env,
    kustomize_build,
    named,
    namespace_of,
    of_kind,
    pod_spec,
    stage_spec,
    workers,
)
from workers import metrics

KEDA_API = "keda.sh/v1alpha1"
IN_PROGRESS = "baton_stages_in_progress"
HPA_TOLERANCE = 0.1
"""The HPA's default `--horizontal-pod-autoscaler-tolerance`: a ratio this close to 1 keeps
the current count."""
CLUSTER_AUTOSCALER_GRACE_S = 600
"""Cluster Autoscaler's default `--max-graceful-termination-sec` for the pods it evicts."""


def scaled_objects() -> dict[str, Doc]:
    """ScaledObjects by the stage of the Deployment they scale."""
    found = {}
    for scaled in of_kind("ScaledObject"):
        assert scaled["apiVersion"] == KEDA_API
        target = scaled["spec"]["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment"
        (stage,) = [
            stage
            for stage, deployment in workers().items()
            if deployment["metadata"]["name"] == target["name"]
            and namespace_of(deployment) == namespace_of(scaled)  # a target in its namespace
        ]
        found[stage] = scaled
    return found


def trigger(scaled: Doc, kind: str) -> Doc:
    (found,) = [t for t in scaled["spec"]["triggers"] if t["type"] == kind]
    return found


# -- the ScaledObjects -------------------------------------------------------------------------


def test_every_worker_deployment_has_exactly_one_scaled_object() -> None:
    assert len(of_kind("ScaledObject")) == len(workers())
    assert set(scaled_objects()) == FIXER_STAGES


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_each_scaled_object_counts_the_waiting_messages_of_its_stage_queue(stage: str) -> None:
    scaled = scaled_objects()[stage]
    assert [t["type"] for t in scaled["spec"]["triggers"]] == ["redis", "prometheus"]
    redis = trigger(scaled, "redis")
    meta = redis["metadata"]
    assert meta["listName"] == stage_spec(stage).queue == f"baton.fixer.{stage}"
    concurrency = container(workers()[stage], "worker")["args"][-1]
    assert meta["listLength"] == concurrency
    assert meta["activationListLength"] == "0"
    url = env(container(workers()[stage], "worker"))["BATON_REDIS_URL"]["value"]
    assert meta["databaseIndex"] == url.rsplit("/", 1)[1] == "0"
    # KEDA runs in its own namespace: the address names Redis's, where the Service really is.
    host, port = meta["address"].split(":")
    service, namespace, svc = host.split(".")
    assert namespace == namespace_of(named("Service", service)) and svc == "svc"
    assert [p["port"] for p in named("Service", service)["spec"]["ports"]] == [int(port)]
    auth = named("TriggerAuthentication", redis["authenticationRef"]["name"], namespace_of(scaled))
    # KEDA's own Redis user (test_k8s_security.py shows what it may do).
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "username", "name": "baton-secrets", "key": "BATON_REDIS_KEDA_USER"},
        {"parameter": "password", "name": "baton-secrets", "key": "BATON_REDIS_KEDA_PASSWORD"},
    ]


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_each_scaled_object_counts_the_stages_its_pods_are_running(stage: str) -> None:
    prometheus = trigger(scaled_objects()[stage], "prometheus")
    meta = prometheus["metadata"]
    assert meta["query"] == f'sum({IN_PROGRESS}{{stage="{stage}"}})'
    # The gauge the workers serve, labelled by the stage alone (labels() refuses other names).
    gauge = metrics._metrics().in_progress
    (family,) = gauge.describe()
    assert (family.name, family.type) == (IN_PROGRESS, "gauge")
    gauge.labels(stage=stage)
    # One replica per running stage, however the stages are spread over the pods.
    assert meta["threshold"] == "1" and meta["activationThreshold"] == "0"
    assert meta["ignoreNullValues"] == "true"  # no series yet is 0, not a failure
    assert re.fullmatch(r"http://[a-z0-9-]+\.[a-z0-9-]+\.svc:\d+", meta["serverAddress"])


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_each_scaled_object_falls_back_to_at_least_the_replicas_it_has(stage: str) -> None:
    spec = scaled_objects()[stage]["spec"]
    assert spec["fallback"] == {
        "failureThreshold": 4,
        "replicas": 1,
        "behavior": "currentReplicasIfHigher",
    }
    # KEDA falls back only for metrics of type AverageValue.
    assert {t["metricType"] for t in spec["triggers"]} == {"AverageValue"}


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_scale_down_waits_longer_than_a_stage_may_run(stage: str) -> None:
    spec = scaled_objects()[stage]["spec"]
    limit_s = stage_spec(stage).budget.time_limit_s
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert spec["cooldownPeriod"] > limit_s
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > limit_s
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    assert 0 <= spec["minReplicaCount"] < spec["maxReplicaCount"]


def test_one_stage_never_scales_to_zero_so_the_reconciler_always_runs() -> None:
    minimum = {stage: doc["spec"]["minReplicaCount"] for stage, doc in scaled_objects().items()}
    assert minimum == {
        "triage": 1, "search": 0, "plan": 0, "reproduce": 0, "fix": 0, "review": 0, "pr": 0
    }  # fmt: skip


# -- what KEDA and the HPA make of it ----------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What a ScaledObject's scalers read at a poll: the stage's waiting messages and the
    stages its pods are running. None: that scaler cannot read its source (Redis or Prometheus
    out of reach) and has failed more than `fallback.failureThreshold` polls in a row."""

    waiting: int | None
    running: int | None


def reading(t: Doc, seen: Seen) -> int | None:
    return {"redis": seen.waiting, "prometheus": seen.running}[t["type"]]


def target(t: Doc) -> float:
    return float(t["metadata"]["listLength" if t["type"] == "redis" else "threshold"])


def activation(t: Doc) -> float:
    key = "activationListLength" if t["type"] == "redis" else "activationThreshold"
    return float(t["metadata"].get(key, "0"))


def hpa_proposal(spec: Doc, t: Doc, value: int | None, current: int) -> int:
    """The HPA's count for one External metric of type AverageValue: ceil(metric / target),
    unless within the tolerance of the current count. A failing scaler's metric is KEDA's
    fallback: target × fallback.replicas (× the current count, if higher, for
    `currentReplicasIfHigher`)."""
    if value is None:
        fallback = spec["fallback"]
        replicas = fallback["replicas"]
        if fallback.get("behavior") == "currentReplicasIfHigher":
            replicas = max(current, replicas)
        metric = replicas * target(t)
    else:
        metric = value
    if abs(metric / (target(t) * current) - 1) <= HPA_TOLERANCE:
        return current
    return math.ceil(metric / target(t))


def next_replicas(scaled: Doc, current: int, seen: Seen) -> int:
    """One poll. KEDA's operator owns zero (pkg/scaling/executor/scale_scaledobjects.go): with
    no trigger active it sets the fallback count itself if a scaler fails, else zero (after
    the cooldown) or the minimum; from zero, an active trigger wakes the minimum, or one. Above
    zero the HPA takes the largest proposal of the triggers, within min and max."""
    spec = scaled["spec"]
    readings = [(t, reading(t, seen)) for t in spec["triggers"]]
    active = any(value is not None and value > activation(t) for t, value in readings)
    minimum, maximum = spec.get("minReplicaCount", 0), spec["maxReplicaCount"]
    if not active and any(value is None for _, value in readings):
        return int(spec["fallback"]["replicas"])
    if not active and minimum == 0:
        return 0
    if current == 0:
        return max(minimum, 1)
    proposals = [hpa_proposal(spec, t, value, current) for t, value in readings]
    return min(max(*proposals, minimum, 1), maximum)


def settled_replicas(scaled: Doc, current: int, seen: Seen) -> int:
    """The count the autoscaler settles on while the scalers keep reading `seen`."""
    for _ in range(10):
        wanted = next_replicas(scaled, current, seen)
        if wanted == current:
            return wanted
        current = wanted
    raise AssertionError(f"no settled count for {seen}")


SITUATIONS = [
    # (what happens, replicas now, what the scalers read, replicas wanted: worked out by hand)
    ("4 of 5 pods run a stage each, 1 message waits", 5, Seen(1, 4), 4),
    ("4 pods run two stages each, 1 message waits", 4, Seen(1, 8), 4),
    ("2 pods run two stages each, 3 messages wait", 2, Seen(3, 4), 4),
    ("3 messages wait, nothing runs, no pod", 0, Seen(3, 0), 2),
    ("nothing waits or runs", 3, Seen(0, 0), 0),
    ("Redis unreadable, 4 pods run a stage each", 4, Seen(None, 4), 4),
    ("Redis unreadable, nothing runs, no pod", 0, Seen(None, 0), 1),
    ("Prometheus unreadable, 3 messages wait, 4 pods", 4, Seen(3, None), 4),
    ("Prometheus unreadable, 3 messages wait, no pod", 0, Seen(3, None), 2),
    # The limit: with both scalers blind and nothing active, KEDA's operator sets the fallback
    # count itself; busy pods then finish their stage within the grace period.
    ("Redis and Prometheus unreadable, 4 pods", 4, Seen(None, None), 1),
]


@pytest.mark.parametrize(
    ("replicas", "seen", "wanted"),
    [situation[1:] for situation in SITUATIONS],
    ids=[situation[0] for situation in SITUATIONS],
)
def test_the_fix_stage_settles_on_the_replicas_its_work_needs(
    replicas: int, seen: Seen, wanted: int
) -> None:
    assert scaled_objects()["fix"]["spec"]["maxReplicaCount"] == 4
    assert settled_replicas(scaled_objects()["fix"], replicas, seen) == wanted


def test_counting_only_the_queue_would_drain_busy_pods() -> None:
    """Why the second trigger: on the queue alone, 4 busy pods and 1 waiting message want 1."""
    alone = copy.deepcopy(scaled_objects()["fix"])
    alone["spec"]["triggers"] = [trigger(alone, "redis")]
    assert settled_replicas(alone, 4, Seen(1, 4)) == 1
    assert settled_replicas(scaled_objects()["fix"], 4, Seen(1, 4)) == 4


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
@pytest.mark.parametrize("redis_readable", [True, False], ids=["redis", "redis-unreadable"])
def test_no_stage_wants_fewer_replicas_than_it_has_busy_pods(
    stage: str, redis_readable: bool
) -> None:
    """Every spread of running stages over the pods (one or two per busy pod, at
    `--concurrency 2`) and any queue: the count stays at or above the busy pods, and above
    zero while a message waits."""
    scaled = scaled_objects()[stage]
    spec = scaled["spec"]
    concurrency = int(container(workers()[stage], "worker")["args"][-1])
    for replicas in range(1, spec["maxReplicaCount"] + 1):
        for busy in range(replicas + 1):
            for running in range(busy, busy * concurrency + 1):
                for waiting in range(7):
                    seen = Seen(waiting if redis_readable else None, running)
                    wanted = settled_replicas(scaled, replicas, seen)
                    assert busy <= wanted <= spec["maxReplicaCount"], (replicas, seen)
                    assert wanted >= 1 or waiting == 0, (replicas, seen)


# -- shutdown ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_the_grace_period_outlasts_the_stage_hard_time_limit(stage: str) -> None:
    grace_s = pod_spec(workers()[stage])["terminationGracePeriodSeconds"]
    assert grace_s == 660
    assert grace_s >= stage_spec(stage).budget.time_limit_s + 30


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_node_autoscalers_leave_a_worker_node_alone_when_the_grace_period_exceeds_their_cap(
    stage: str,
) -> None:
    """Cluster Autoscaler cuts an evicted pod's grace period to 600 s: a worker needing longer
    must keep it (and Karpenter) from draining its node."""
    deployment = workers()[stage]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] > CLUSTER_AUTOSCALER_GRACE_S
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"


# -- the namespaces, renamed -------------------------------------------------------------------


def renamed_copy(tmp_path: Path, core: str, sandbox: str) -> Path:
    """k8s/ with its two namespaces renamed where k8s/README.md says to."""
    copied = copy_with_example_secrets(tmp_path)
    for directory, name in (("baton", core), ("sandbox", sandbox)):
        path = copied / directory / "kustomization.yaml"
        spec = yaml.safe_load(path.read_text())
        spec["namespace"] = name
        path.write_text(yaml.safe_dump(spec))
    return copied


def check_renamed(docs: list[Doc], core: str, sandbox: str) -> None:
    assert {namespace_of(doc) for doc in docs} == {core, sandbox}
    for doc in docs:
        text = yaml.safe_dump(doc)
        # The old names, as a word (the sandbox image `…/baton-sandbox:2` is no namespace).
        names = f"({NAMESPACE}|{SANDBOX_NAMESPACE})"
        old = re.findall(rf"\.{NAMESPACE}\.svc|(metadata\.name|namespace): {names}\n", text)
        assert old == [], doc["metadata"]
    urls = [
        var["value"]
        for doc in docs
        if doc["kind"] == "Deployment"
        for var in doc["spec"]["template"]["spec"]["containers"][0]["env"]
        if var["name"] == "BATON_REDIS_URL"
    ]
    assert len(urls) == len(FIXER_STAGES) + 2
    assert {url.split("@")[1] for url in urls} == {f"baton-redis.{core}.svc:6379/0"}
    addresses = {
        t["metadata"]["address"]
        for doc in docs
        if doc["kind"] == "ScaledObject"
        for t in doc["spec"]["triggers"]
        if t["type"] == "redis"
    }
    assert addresses == {f"baton-redis.{core}.svc:6379"}
    policies = {
        (namespace_of(doc), doc["metadata"]["name"]): yaml.safe_dump(doc)
        for doc in docs
        if doc["kind"] == "NetworkPolicy"
    }
    assert f"kubernetes.io/metadata.name: {sandbox}\n" in policies[(core, "baton-redis")]
    for namespace in (core, sandbox):
        assert f"kubernetes.io/metadata.name: {core}\n" in policies[(namespace, "baton-workers")]


def test_every_address_and_policy_follows_the_namespaces_when_they_are_renamed(
    tmp_path: Path,
) -> None:
    copied = renamed_copy(tmp_path, "ops", "ops-sandbox")
    check_renamed(build(copied), "ops", "ops-sandbox")
    check_renamed(kustomize_build(copied), "ops", "ops-sandbox")
