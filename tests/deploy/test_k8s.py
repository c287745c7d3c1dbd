"""k8s/: Baton on Kubernetes, checked offline.

The core objects validate against the Kubernetes 1.30 schemas that `kubernetes-validate` ships;
KEDA's objects (custom resources) are checked by structure. Cross-references are checked on
what `kustomize build k8s/` would produce, rendered by tests/deploy/manifests.py, and that
rendering is compared with what kubectl's kustomize builds (the kubectl of the dev extras). Pod
Security and network policies are in test_k8s_security.py, the autoscalers in
test_k8s_autoscaling.py.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import kubernetes_validate
import pytest
import yaml

from images import build as images_build
from images.build import image_tag, source_tag, write_overlay
from orchestrator.control.server.app import API
from orchestrator.control.server.auth import Authenticator, ServeSettings
from orchestrator.core.connection import checked_config
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import check_time_limits
from orchestrator.core.settings import DEFAULT_MODEL
from sandbox.build import ENV_REPOSITORY
from sandbox.gate.policy import GatePolicy, image_refusal
from tests.deploy.manifests import (
    CODE_STAGES,
    FIXER_STAGES,
    K8S,
    NAMESPACE,
    RENDERED,
    SANDBOX_NAMESPACE,
    Doc,
    build,
    config_data,
    container,
    containers,
    copy_with_example_secrets,
    env,
    generated_env_files,
    kustomization,
    kustomization_directories,
    kustomize_build,
    mebibytes,
    metrics_port,
    named,
    namespace_of,
    of_kind,
    pod_labels,
    selects,
    sidecars,
    stage_spec,
    workers,
    workloads,
)
from workers.settings import WorkerSettings

KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests are for (native sidecars need 1.29 or later)."""
KEDA_API = "keda.sh/v1alpha1"
REDIS_ADDRESS = "baton-redis.baton.svc:6379/0"
"""Redis by its namespace-qualified name: the code stages reach it from their own namespace."""
REDIS_USERS = {
    "worker": "baton-secrets",
    "serve": "baton-serve-auth",
    "flower": "baton-flower-auth",
}
"""Each Redis client's role (its container's name), and the Secret with its user's password."""
METRICS_PORT = 9808
"""`BATON_METRICS_PORT` by convention (workers.settings)."""
SERVE_PORT = 8080
WORKER_SECRETS = {"GOOGLE_API_KEY", "BATON_GITHUB_TOKEN"}
"""What only workers may get (the GitHub token only pr's: test_k8s_security.py)."""
HEALTH_PATH = "/api/v1/health"
"""`baton serve`'s probe: it answers without a login, while Redis answers."""


# -- schemas -----------------------------------------------------------------------------------


def core_ids() -> list[tuple[str, Doc]]:
    return [
        (f"{doc['kind']}/{namespace_of(doc)}/{doc['metadata']['name']}", doc)
        for doc in RENDERED
        if not doc["apiVersion"].startswith("keda.sh/")
    ]


@pytest.mark.parametrize("doc", [d for _, d in core_ids()], ids=[i for i, _ in core_ids()])
def test_every_core_object_validates_strictly_against_the_kubernetes_schemas(doc: Doc) -> None:
    used = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert used == KUBERNETES_VERSION


def test_the_custom_resources_are_keda_scaled_objects_and_a_trigger_authentication_each() -> None:
    custom = [doc for doc in RENDERED if doc["apiVersion"].startswith("keda.sh/")]
    assert {doc["apiVersion"] for doc in custom} == {KEDA_API}
    kinds = [doc["kind"] for doc in custom]
    assert sorted(kinds) == ["ScaledObject"] * len(FIXER_STAGES) + ["TriggerAuthentication"] * 2
    # A ScaledObject's TriggerAuthentication must be in its own namespace.
    authentications = {namespace_of(doc) for doc in of_kind("TriggerAuthentication")}
    assert authentications == {namespace_of(doc) for doc in of_kind("ScaledObject")}


# -- workers and the pipeline ------------------------------------------------------------------


def test_worker_deployments_are_exactly_the_stages_of_the_fixer_pipeline() -> None:
    stages = {stage.name for stage in load_pipeline("fixer").stages}
    assert stages == FIXER_STAGES
    assert set(workers()) == stages
    for stage, deployment in workers().items():
        assert deployment["metadata"]["name"] == f"baton-worker-{stage}"
        assert deployment["spec"]["template"]["metadata"]["labels"] == {
            "app.kubernetes.io/name": "baton",
            "app.kubernetes.io/component": "worker",
            "app.kubernetes.io/part-of": "baton",
            "baton.dev/stage": stage,
        }


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_each_worker_serves_its_own_stage_and_nothing_else(stage: str) -> None:
    worker = container(workers()[stage], "worker")
    assert worker["args"] == [
        "worker", "--pipeline", "fixer", "--stages", stage, "--concurrency", "2"
    ]  # fmt: skip


def init_container(deployment: Doc, name: str) -> Doc:
    return next(c for kind, c in containers(deployment) if kind == "init" and c["name"] == name)


def environment_tag_example() -> str:
    """An environment image's name, as a build in the daemon commits it."""
    return f"{ENV_REPOSITORY}:0123456789abcdef"


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_code_stages_have_a_docker_sidecar_and_tool_less_stages_have_none(stage: str) -> None:
    deployment = workers()[stage]
    worker = container(deployment, "worker")
    privileged = [
        c for _, c in containers(deployment) if c.get("securityContext", {}).get("privileged")
    ]
    if not stage_spec(stage).tools:
        assert stage not in CODE_STAGES
        assert not privileged and "initContainers" not in deployment["spec"]["template"]["spec"]
        assert "DOCKER_HOST" not in env(worker)
        return
    assert stage in CODE_STAGES
    dind, gate = sidecars(deployment)
    assert privileged == [dind] and dind["image"].startswith("docker:") and "dind" in dind["image"]
    assert dind["restartPolicy"] == gate["restartPolicy"] == "Always"
    # The API is that socket only: no TCP listener another container could reach.
    hosts = [arg for arg in dind["args"] if arg.startswith(("--host", "-H"))]
    assert dind["args"][0] == "dockerd" and hosts == ["--host=unix:///var/run/dind/docker.sock"]
    # The worker reaches the daemon only through the sandbox gate, which alone mounts its socket
    # besides the daemon (and the image puller, which runs before either).
    assert gate["args"][0] == "sandbox-gate" and gate["image"] == worker["image"]
    assert "--docker=unix:///var/run/dind/docker.sock" in gate["args"]
    assert "--listen=/var/run/gate/docker.sock" in gate["args"]
    # It lets through the sandbox image the daemon pulled, and the environments built there.
    prefixes = tuple(a.split("=", 1)[1] for a in gate["args"] if a.startswith("--allow-image"))
    assert (
        env(gate)["BATON_SANDBOX_IMAGE"]
        == env(init_container(deployment, "sandbox-image"))["BATON_SANDBOX_IMAGE"]
    )
    allowed = GatePolicy(image_prefixes=tuple(
        p.replace("$(BATON_SANDBOX_IMAGE)", config_data()["BATON_SANDBOX_IMAGE"]) for p in prefixes
    ))  # fmt: skip
    for image in (config_data()["BATON_SANDBOX_IMAGE"], environment_tag_example()):
        assert image_refusal(allowed, image) is None, image
    assert image_refusal(allowed, "alpine:3") is not None
    assert env(worker)["DOCKER_HOST"]["value"] == "unix:///var/run/gate/docker.sock"
    mounts = {
        c["name"]: {m["mountPath"]: m for m in c["volumeMounts"]} for c in (dind, gate, worker)
    }
    assert (
        mounts["dind"]["/var/run/dind"]["name"] == mounts["sandbox-gate"]["/var/run/dind"]["name"]
    )
    assert mounts["sandbox-gate"]["/var/run/dind"].get("readOnly") is True
    assert (
        mounts["sandbox-gate"]["/var/run/gate"]["name"] == mounts["worker"]["/var/run/gate"]["name"]
    )
    assert mounts["worker"]["/var/run/gate"].get("readOnly") is True
    assert "/var/run/dind" not in mounts["worker"]
    socket_volume = mounts["dind"]["/var/run/dind"]["name"]
    assert all(m["name"] != socket_volume for m in worker["volumeMounts"])
    assert "/var/lib/docker" in mounts["dind"] and "/var/lib/docker" not in mounts["worker"]


@pytest.mark.parametrize("stage", CODE_STAGES)
def test_the_sandbox_image_is_pulled_into_the_sidecar_before_the_worker_starts(stage: str) -> None:
    init = [c for kind, c in containers(workers()[stage]) if kind == "init"]
    assert [c["name"] for c in init] == ["dind", "sandbox-image", "sandbox-gate"]
    pull = init[1]
    assert pull["command"] == ["docker", "pull", "$(BATON_SANDBOX_IMAGE)"]
    assert env(pull)["BATON_SANDBOX_IMAGE"]["valueFrom"]["configMapKeyRef"] == {
        "name": "baton-config",
        "key": "BATON_SANDBOX_IMAGE",
    }
    assert env(pull)["DOCKER_HOST"]["value"] == "unix:///var/run/dind/docker.sock"
    worker = container(workers()[stage], "worker")
    assert {"configMapRef": {"name": "baton-config"}} in worker["envFrom"]


@pytest.mark.parametrize("stage", CODE_STAGES)
def test_the_sidecar_memory_holds_every_sandbox_the_worker_may_run_at_once(stage: str) -> None:
    deployment = workers()[stage]
    concurrency = int(container(deployment, "worker")["args"][-1])
    sandbox_mb = int(config_data()["BATON_SANDBOX__MEMORY_MB"])
    dind = next(c for c in sidecars(deployment) if c["name"] == "dind")
    limit_mb = mebibytes(dind["resources"]["limits"]["memory"])
    assert limit_mb >= concurrency * sandbox_mb + 256


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_worker_probes_read_the_health_file_and_forgive_missed_touches(stage: str) -> None:
    """The consumer touches the file at every heartbeat, 2 s apart (Celery's default): a
    probe forgives ten missed ones, and the liveness probe three failures more."""
    worker = container(workers()[stage], "worker")
    heartbeat_s = 2.0
    assert config_data()["BATON_HEALTH_FILE"] == "/tmp/baton-alive"
    assert not any("heartbeat" in arg for arg in worker.get("args", []))
    ages = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = worker[probe]["exec"]["command"]
        assert "BATON_HEALTH_FILE" in command[-1]
        (max_age_s,) = re.findall(r"> (\d+)\)$", command[-1])
        ages[probe] = float(max_age_s)
        assert ages[probe] >= 10 * heartbeat_s
    assert ages["livenessProbe"] >= ages["readinessProbe"]
    assert worker["livenessProbe"]["failureThreshold"] >= 3


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_each_worker_serves_metrics_on_the_config_map_port_its_annotations_announce(
    stage: str,
) -> None:
    deployment = workers()[stage]
    worker = container(deployment, "worker")
    port = metrics_port()
    assert port == METRICS_PORT
    # The worker reads the port from the ConfigMap (envFrom); a container `env` would win.
    assert {"configMapRef": {"name": "baton-config"}} in worker["envFrom"]
    assert "BATON_METRICS_PORT" not in env(worker)
    assert worker["ports"] == [{"name": "metrics", "containerPort": port}]
    others = [c["name"] for _, c in containers(deployment) if c is not worker and "ports" in c]
    assert others == []
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    announced = {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}
    assert announced == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    # Annotations on the Deployment itself are not what pod discovery reads.
    assert "annotations" not in deployment["metadata"]


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_workers_write_only_to_volumes_under_a_read_only_root(stage: str) -> None:
    worker = container(workers()[stage], "worker")
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    assert worker["securityContext"]["runAsNonRoot"] is True
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounted = [m["mountPath"] for m in worker["volumeMounts"] if not m.get("readOnly")]
    written = [
        config_data()["BATON_HEALTH_FILE"],
        config_data()["BATON_METRICS_DIR"],
        env(worker)["HOME"]["value"],
    ]
    if stage_spec(stage).tools:
        written.append(config_data()["BATON_REPO_CACHE_DIR"])
    for path in written:
        assert any(path == mount or path.startswith(mount + "/") for mount in mounted), path


# -- Redis, Flower, serve, secrets -------------------------------------------------------------


def redis_clients() -> list[Doc]:
    return [c for doc in workloads() for _, c in containers(doc) if "BATON_REDIS_URL" in env(c)]


def test_every_redis_client_logs_in_as_its_own_user_with_its_own_password() -> None:
    clients = redis_clients()
    # The workers, each code stage's environment builder (a worker too), Flower and serve.
    assert len(clients) == len(FIXER_STAGES) + len(CODE_STAGES) + 2
    redis_env = env(container(named("StatefulSet", "baton-redis"), "redis"))
    for client in clients:
        user = "worker" if client["name"] == "builder" else client["name"]
        variable = f"BATON_REDIS_{user.upper()}_PASSWORD"
        names = [var["name"] for var in client["env"]]
        assert env(client)["BATON_REDIS_URL"]["value"] == (
            f"redis://{user}:$({variable})@{REDIS_ADDRESS}"
        )
        # $(VAR) expands only variables defined before it.
        assert names.index(variable) < names.index("BATON_REDIS_URL")
        assert "BATON_REDIS_PASSWORD" not in names  # Redis's admin password: Redis's own
        mine = env(client)[variable]["valueFrom"]["secretKeyRef"]
        assert mine == {"name": REDIS_USERS[user], "key": variable}
        # Redis makes the user with the very same password (redis-users.sh reads `variable`).
        assert redis_env[variable]["valueFrom"]["secretKeyRef"] == mine
        # What Baton's settings accept: a user and a long enough password, for a remote host.
        url = env(client)["BATON_REDIS_URL"]["value"].replace(f"$({variable})", "0" * 32)
        assert checked_config(url).url == url
    # The Service by its namespace-qualified name, in the namespace where it really is.
    service = named("Service", "baton-redis")
    host, port = REDIS_ADDRESS.split("/")[0].split(":")
    assert host == f"baton-redis.{namespace_of(service)}.svc"
    assert service["spec"]["ports"][0]["port"] == int(port)


def test_dollar_references_name_variables_the_container_defines() -> None:
    for doc in workloads():
        for _, c in containers(doc):
            known = set(config_data()) if c.get("envFrom") else set()
            for var in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", var.get("value", "")):
                    assert ref in known, f"{c['name']}: {var['name']} uses $({ref}) before it"
                known.add(var["name"])
            for arg in c.get("command", []) + c.get("args", []):
                for ref in re.findall(r"\$\((\w+)\)", arg):
                    assert ref in known, f"{c['name']}: $({ref}) is not defined"


def test_redis_persists_every_second_never_evicts_and_keeps_its_password_off_argv() -> None:
    redis = named("StatefulSet", "baton-redis")
    assert redis["spec"]["replicas"] == 1
    server = container(redis, "redis")
    shell, flag, script = server["command"]
    assert (shell, flag) == ("sh", "-c") and "args" not in server
    command = script.split("<<")[0].split("exec ", 1)[1].replace("\\\n", " ").split()
    assert command[:2] == ["redis-server", "-"]  # configuration on stdin, then flags
    flags = dict(zip(command[2::2], command[3::2], strict=True))
    assert flags["--appendonly"] == "yes" and flags["--appendfsync"] == "everysec"
    assert flags["--maxmemory-policy"] == "noeviction"
    # Room under the container's limit for the fork of an AOF rewrite.
    limit_mb = mebibytes(server["resources"]["limits"]["memory"])
    assert mebibytes(flags["--maxmemory"].removesuffix("b").upper()) <= 0.6 * limit_mb
    # The users, made from the ACL and the script in the ConfigMap mounted where it runs them.
    assert script.splitlines()[0] == (
        "users=$(sh /etc/baton-redis/redis-users.sh /etc/baton-redis/redis-users.acl) || exit 1"
    )
    assert {"name": "users", "mountPath": "/etc/baton-redis", "readOnly": True} in server[
        "volumeMounts"
    ]
    volumes = {v["name"]: v for v in redis["spec"]["template"]["spec"]["volumes"]}
    users = named("ConfigMap", volumes["users"]["configMap"]["name"], NAMESPACE)["data"]
    for name in ("redis-users.acl", "redis-users.sh"):
        assert users[name] == (K8S / "baton" / name).read_text()
    # The admin password, for the probes too, from a Secret of Redis's namespace alone.
    admin = {"name": "baton-redis-auth", "key": "BATON_REDIS_PASSWORD"}
    for variable in ("REDISCLI_AUTH", "BATON_REDIS_PASSWORD"):
        assert env(server)[variable]["valueFrom"]["secretKeyRef"] == admin
    assert not [s for s in of_kind("Secret") if s["metadata"]["name"] == "baton-redis-auth"
                and namespace_of(s) != NAMESPACE]  # fmt: skip
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mount = {"name": claim["metadata"]["name"], "mountPath": flags["--dir"]}
    assert mount in server["volumeMounts"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "redis-cli ping" in server[probe]["exec"]["command"][-1]
    governing = named("Service", redis["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"


def test_flower_runs_once_on_its_port_with_probes_on_healthcheck() -> None:
    flower = named("Deployment", "baton-flower")
    assert flower["spec"]["replicas"] == 1
    (app,) = [c for _, c in containers(flower)]
    assert app["args"] == ["flower"]
    assert app["ports"] == [{"name": "http", "containerPort": 5555}]
    assert env(app)["BATON_FLOWER_PORT"]["value"] == "5555"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert app[probe]["httpGet"] == {"path": "/healthcheck", "port": "http"}
    assert named("Service", "baton-flower")["spec"]["ports"] == [
        {"name": "http", "port": 5555, "targetPort": "http"}
    ]
    secrets = {v["valueFrom"]["secretKeyRef"]["key"] for v in app["env"] if "valueFrom" in v}
    assert secrets == {"BATON_FLOWER_USER", "BATON_FLOWER_PASSWORD", "BATON_REDIS_FLOWER_PASSWORD"}


def serve() -> Doc:
    return named("Deployment", "baton-serve")


def test_serve_listens_on_its_port_with_every_probe_on_the_health_endpoint() -> None:
    (app,) = [c for _, c in containers(serve())]
    assert app["name"] == "serve"
    assert app["args"] == ["serve", "--port", str(SERVE_PORT)]
    assert app["ports"] == [{"name": "http", "containerPort": SERVE_PORT}]
    assert HEALTH_PATH == f"{API}/health"  # the route that answers without a login
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert app[probe]["httpGet"] == {"path": HEALTH_PATH, "port": "http"}, probe
    # The health endpoint fails while Redis does; liveness waits out a Redis restart.
    live = app["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 120
    assert named("Service", "baton-serve")["spec"]["ports"] == [
        {"name": "http", "port": SERVE_PORT, "targetPort": "http"}
    ]


def test_serve_takes_its_login_and_cookie_key_from_its_own_secret() -> None:
    deployment = serve()
    app = container(deployment, "serve")
    from_secrets = {
        var["name"]: var["valueFrom"]["secretKeyRef"] for var in app["env"] if "valueFrom" in var
    }
    own = {"name": "baton-serve-auth"}
    assert from_secrets == {
        "BATON_SERVE_USER": {**own, "key": "BATON_SERVE_USER"},
        "BATON_SERVE_PASSWORD": {**own, "key": "BATON_SERVE_PASSWORD"},
        "BATON_SERVE_SECRET": {**own, "key": "BATON_SERVE_SECRET"},
        "BATON_SERVE_LOGINS": {**own, "key": "BATON_SERVE_LOGINS", "optional": True},
        "BATON_SERVE_TOKENS": {**own, "key": "BATON_SERVE_TOKENS", "optional": True},
        "BATON_REDIS_SERVE_PASSWORD": {**own, "key": "BATON_REDIS_SERVE_PASSWORD"},
    }
    assert "envFrom" not in app
    literal = {var["name"] for var in app["env"] if "value" in var}
    assert literal == {
        "BATON_SERVE_FLOWER_URL",
        "BATON_SERVE_SECURE_COOKIES",
        "BATON_REDIS_URL",
        "HOME",
    }
    # More than one replica: a session one of them signs must be good on the others.
    assert deployment["spec"]["replicas"] >= 2 and "BATON_SERVE_SECRET" in from_secrets


def test_serve_settings_read_from_its_environment_make_a_control_login(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = named("Secret", "baton-serve-auth")["data"]
    values = {key: base64.b64decode(value).decode() for key, value in secret.items()}
    # The examples the operator may uncomment count too.
    for line in (K8S / "baton" / "serve.env.example").read_text().splitlines():
        if line.startswith("#BATON_SERVE_"):
            key, _, value = line.removeprefix("#").partition("=")
            values[key] = value
    for name in [n for n in os.environ if n.startswith("BATON_")]:
        monkeypatch.delenv(name)
    for var in container(serve(), "serve")["env"]:
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] == "baton-serve-auth":
            monkeypatch.setenv(var["name"], values[ref["key"]])
        elif var["name"].startswith("BATON_SERVE_"):
            monkeypatch.setenv(var["name"], var["value"])
    for key in [key for key in values if key.startswith("BATON_SERVE_")]:
        field = key.removeprefix("BATON_SERVE_").lower()
        assert field in ServeSettings.model_fields, f"baton serve has no setting {key}"
    settings = ServeSettings()
    assert settings.secret is not None and settings.secure_cookies is False
    authenticator = Authenticator(settings)
    user, password = values["BATON_SERVE_USER"], values["BATON_SERVE_PASSWORD"]
    login = authenticator.log_in(user, password)
    assert login is not None and login.scope == "control"
    assert {token.scope for token in authenticator.tokens} == {"read"}
    assert set(authenticator.logins) == {user, "viewer"}


def test_serve_gets_no_model_key_github_token_or_docker_and_writes_only_to_tmp() -> None:
    deployment = serve()
    pod = deployment["spec"]["template"]["spec"]
    app = container(deployment, "serve")
    assert "initContainers" not in pod and len(pod["containers"]) == 1
    assert not (WORKER_SECRETS | {"DOCKER_HOST"}) & set(env(app))
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert app["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert env(app)["HOME"]["value"] == "/tmp"
    context = app["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["runAsNonRoot"] is True
    assert context["runAsUser"] == 1000 and not context.get("privileged")


def test_a_disruption_budget_keeps_a_serve_pod_up_and_never_blocks_a_drain_for_good() -> None:
    deployment = serve()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budgets = [b for b in of_kind("PodDisruptionBudget") if selects(b["spec"]["selector"], labels)]
    (budget,) = budgets
    assert namespace_of(budget) == namespace_of(deployment) == NAMESPACE
    # It selects serve's pods and no other workload's.
    others = [doc for doc in workloads() if doc is not deployment]
    assert not any(
        selects(budget["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        for d in others
    )
    spec = budget["spec"]
    # One evicted at a time, of at least two: one always answers. maxUnavailable (never
    # minAvailable, which a single replica could not satisfy) lets a drain finish whatever the
    # replica count; a pod that is not ready serves nobody and may always go.
    assert "minAvailable" not in spec
    assert spec["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # A rolling update never takes a pod down before its successor is ready.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_serve_pods_spread_over_nodes_and_zones_without_stranding_a_pod() -> None:
    deployment = serve()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    constraints = {
        c["topologyKey"]: c
        for c in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    }
    assert set(constraints) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    others = [
        d["spec"]["template"]["metadata"]["labels"] for d in workloads() if d is not deployment
    ]
    for constraint in constraints.values():  # counting serve's pods and only those
        assert constraint["maxSkew"] == 1
        assert selects(constraint["labelSelector"], labels)
        assert not any(selects(constraint["labelSelector"], other) for other in others)
    nodes, zones = constraints["kubernetes.io/hostname"], constraints["topology.kubernetes.io/zone"]
    # Two pods never share a node while another could take one; a node that takes no pod (a
    # tainted control plane, a cordoned node being drained) is not counted, or the second pod
    # would wait forever for it.
    assert nodes["whenUnsatisfiable"] == "DoNotSchedule"
    assert (nodes["nodeTaintsPolicy"], nodes["nodeAffinityPolicy"]) == ("Honor", "Honor")
    # Zones are a preference: a cluster in one zone, or without zone labels, still schedules.
    assert zones["whenUnsatisfiable"] == "ScheduleAnyway"


def test_every_pod_goes_without_service_links_and_service_account_token() -> None:
    for doc in workloads():
        pod = doc["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False, doc["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, doc["metadata"]["name"]


PINNED = re.compile(r"[a-z0-9./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}")
"""A third-party image by digest: what it names cannot change under the same reference."""


def test_baton_containers_run_the_image_make_images_builds_and_redis_is_one_of_them() -> None:
    assert "images" not in kustomization()
    roles = ("worker", "flower", "serve", "redis")
    baton = [c for doc in workloads() for _, c in containers(doc) if c["name"] in roles]
    assert len(baton) == len(FIXER_STAGES) + 3
    assert {c["image"] for c in baton} == {image_tag()}
    assert image_tag() == "baton:0.1.0"


def test_the_overlay_make_images_writes_runs_this_source_and_pins_every_other_image(
    tmp_path: Path,
) -> None:
    """Deployed through build/k8s, every container runs either the image built from this
    checkout, under a tag no other build shares, or a third-party image by digest."""
    tag = source_tag()
    assert re.fullmatch(r"baton:0\.1\.0-[0-9a-f]{12}", tag)
    pushed = f"registry.example.com/baton/{tag}"
    overlay = write_overlay(pushed, tmp_path / "k8s")
    images = [
        c["image"]
        for doc in build(overlay.parent)
        if doc["kind"] in ("Deployment", "StatefulSet")
        for _, c in containers(doc)
    ]
    ours = [image for image in images if image == pushed]
    theirs = [image for image in images if image != pushed]
    # Workers, Flower, serve, Redis, and the code stages' sandbox gates and builders.
    assert len(ours) == len(FIXER_STAGES) + 3 + 2 * len(CODE_STAGES)
    assert theirs and all(PINNED.fullmatch(image) for image in theirs), theirs
    assert {image.split("@")[0] for image in theirs} == {"docker:27-dind"}


def test_a_change_to_the_source_is_a_new_image_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    before = source_tag()
    monkeypatch.setattr(images_build, "DOCKERFILE", K8S / "kustomization.yaml")
    assert source_tag() != before


# -- cross-references --------------------------------------------------------------------------


def test_every_workload_selector_matches_its_own_pod_template() -> None:
    for doc in workloads():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selects(doc["spec"]["selector"], labels), doc["metadata"]["name"]


def test_every_service_selects_the_pods_of_some_workload_in_its_namespace() -> None:
    for service in of_kind("Service"):
        selector = {"matchLabels": service["spec"]["selector"]}
        here = pod_labels(namespace_of(service))
        assert any(selects(selector, labels) for labels in here), service["metadata"]


REF_KINDS = {
    "secretKeyRef": "Secret",
    "secretRef": "Secret",
    "configMapKeyRef": "ConfigMap",
    "configMapRef": "ConfigMap",
}


class Reference(NamedTuple):
    """A Secret or ConfigMap something refers to: one key of it, or all (`key` None)."""

    kind: str
    namespace: str
    """Where it must be: the namespace of whatever refers to it."""
    name: str
    key: str | None
    optional: bool = False
    """The pod starts without it (`optional: true`): a key the operator may leave out."""


def container_references(c: Doc, namespace: str) -> Iterator[Reference]:
    for var in c.get("env", []):
        for ref_kind, ref in var.get("valueFrom", {}).items():
            if ref_kind in REF_KINDS:
                optional = ref.get("optional", False)
                yield Reference(REF_KINDS[ref_kind], namespace, ref["name"], ref["key"], optional)
    for source in c.get("envFrom", []):
        for ref_kind, ref in source.items():
            if ref_kind in REF_KINDS:
                yield Reference(REF_KINDS[ref_kind], namespace, ref["name"], None)


def references() -> Iterator[Reference]:
    """Every Secret and ConfigMap something refers to."""
    for doc in workloads():
        namespace = namespace_of(doc)
        for _, c in containers(doc):
            yield from container_references(c, namespace)
        for volume in doc["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in volume:
                yield Reference("Secret", namespace, volume["secret"]["secretName"], None)
            if "configMap" in volume:
                yield Reference("ConfigMap", namespace, volume["configMap"]["name"], None)
    for auth in of_kind("TriggerAuthentication"):
        for ref in auth["spec"].get("secretTargetRef", []):
            yield Reference("Secret", namespace_of(auth), ref["name"], ref["key"])


def test_every_secret_and_config_map_reference_names_a_key_the_kustomization_defines() -> None:
    found = list(references())
    assert {(ref.kind, ref.namespace, ref.name) for ref in found} == {
        ("Secret", NAMESPACE, "baton-secrets"),
        ("Secret", NAMESPACE, "baton-flower-auth"),
        ("Secret", NAMESPACE, "baton-serve-auth"),
        ("Secret", NAMESPACE, "baton-redis-auth"),
        ("ConfigMap", NAMESPACE, "baton-config"),
        ("ConfigMap", NAMESPACE, "baton-redis-users"),
        ("Secret", SANDBOX_NAMESPACE, "baton-secrets"),
        ("Secret", SANDBOX_NAMESPACE, "baton-github"),
        ("ConfigMap", SANDBOX_NAMESPACE, "baton-config"),
    }
    for ref in found:
        doc = named(ref.kind, ref.name, ref.namespace)
        if ref.key is not None and not ref.optional:
            assert ref.key in doc["data"], f"{ref.kind} {ref.name} has no key {ref.key}"
    # An optional key is still one the example shows (maybe commented out), for the operator.
    for ref in found:
        if ref.optional:
            lines = [
                line.lstrip("#")
                for path in generated_env_files()[ref.name]
                for line in path.with_name(f"{path.name}.example").read_text().splitlines()
            ]
            assert any(line.startswith(f"{ref.key}=") for line in lines), ref


def test_both_namespaces_hold_the_same_settings() -> None:
    assert config_data(NAMESPACE) == config_data(SANDBOX_NAMESPACE)
    assert len(config_data()) > 10


# -- settings ----------------------------------------------------------------------------------


def test_the_config_map_holds_only_settings_baton_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    data = config_data()
    for key in data:
        assert key.startswith("BATON_"), key
        field = key.removeprefix("BATON_").lower().split("__")[0]
        assert field in WorkerSettings.model_fields, f"Baton has no setting {key}"
    for name in [n for n in os.environ if n.startswith(("BATON_", "GOOGLE_"))]:
        monkeypatch.delenv(name)
    for key, value in {**data, "BATON_REDIS_URL": "redis://:pw@baton-redis:6379/0"}.items():
        monkeypatch.setenv(key, value)
    settings = WorkerSettings()
    assert settings.health_file == Path("/tmp/baton-alive")
    assert settings.metrics_port == METRICS_PORT
    assert settings.metrics_dir == Path("/tmp/baton-metrics")
    assert settings.queue.reconcile_every_s == 30
    assert settings.sandbox_config().memory_mb == 1024
    assert settings.quotas[DEFAULT_MODEL].requests_per_minute == 60
    check_time_limits(load_pipeline("fixer"), settings.queue, settings.retry)


# -- the kustomization -------------------------------------------------------------------------


def test_each_kustomization_lists_every_manifest_beside_it_and_only_existing_files() -> None:
    for directory in kustomization_directories():
        spec = kustomization(directory)
        listed = spec["resources"]
        assert len(set(listed)) == len(listed), directory
        assert all((directory / name).exists() for name in listed), directory
        manifests = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
        assert {name for name in listed if name.endswith(".yaml")} == manifests - {
            "namespaces.yaml"  # applied by hand (test_k8s_security.py)
        }, directory
        env_files = [name for gen in spec.get("secretGenerator", []) for name in gen["envs"]]
        examples = {p.name.removesuffix(".example") for p in directory.glob("*.example")}
        assert sorted(examples) == sorted(env_files), directory
        files = [name for gen in spec.get("configMapGenerator", []) for name in gen["files"]]
        assert all((directory / name).is_file() for name in files), directory
        # Nothing else: the env files themselves are the operator's, git-ignored.
        others = {"kustomization.yaml", "README.md", ".gitignore", "namespaces.yaml", *env_files,
                  *files}  # fmt: skip
        subdirectories = {d.name for d in kustomization_directories() if d.parent == directory}
        allowed = manifests | examples | {f"{n}.example" for n in env_files} | others
        assert {p.name for p in directory.iterdir()} <= allowed | subdirectories, directory
    ignored = (K8S / ".gitignore").read_text().splitlines()
    assert {path.name for paths in generated_env_files().values() for path in paths} == {
        "secrets.env",
        "flower.env",
        "serve.env",
        "github.env",
        "redis.env",
    }
    assert all(path.name in ignored for paths in generated_env_files().values() for path in paths)


def test_the_namespaces_are_set_by_the_two_kustomizations_and_nowhere_else() -> None:
    assert "namespace" not in kustomization()
    assert kustomization(K8S / "baton")["namespace"] == NAMESPACE
    assert kustomization(K8S / "sandbox")["namespace"] == SANDBOX_NAMESPACE
    assert "namespace" not in kustomization(K8S / "common")
    for directory in kustomization_directories():
        for resource in kustomization(directory)["resources"]:
            if (directory / resource).is_file():
                for doc in yaml.safe_load_all((directory / resource).read_text()):
                    assert "namespace" not in doc["metadata"], f"{resource}: {doc['metadata']}"
        for generator in kustomization(directory).get("secretGenerator", []):
            assert "namespace" not in generator, generator["name"]
    assert {namespace_of(doc) for doc in RENDERED} == {NAMESPACE, SANDBOX_NAMESPACE}
    assert of_kind("Namespace") == []  # namespaces.yaml, applied by hand


def test_kustomize_builds_the_objects_the_loader_renders(tmp_path: Path) -> None:
    built = kustomize_build(copy_with_example_secrets(tmp_path))

    def ids(docs: list[Doc]) -> list[tuple[str, str, str]]:
        return sorted((d["kind"], namespace_of(d), d["metadata"]["name"]) for d in docs)

    assert ids(built) == ids(RENDERED)
    for doc in RENDERED:
        assert doc in built, f"kustomize renders {doc['kind']} {doc['metadata']['name']} otherwise"
