"""k8s/: Baton on Kubernetes, checked offline.

The core objects validate against the Kubernetes 1.30 schemas that `kubernetes-validate` ships;
KEDA's objects (custom resources) are checked by structure. Cross-references are checked on
what `kustomize build k8s/` would produce, rendered here by a small loader of
`kustomization.yaml` (namespace, labels, images, secret generators); where a `kustomize` or
`kubectl` binary exists, its build is compared with the loader's.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes_validate
import pytest
import yaml

from orchestrator.pipeline import StageSpec, load_pipeline
from orchestrator.queue import check_time_limits
from orchestrator.server.app import API
from orchestrator.server.auth import Authenticator, ServeSettings
from orchestrator.settings import DEFAULT_MODEL
from workers.settings import WorkerSettings

K8S = Path(__file__).resolve().parents[2] / "k8s"
KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests are for (native sidecars need 1.29 or later)."""
NAMESPACE = "baton"
KEDA_API = "keda.sh/v1alpha1"
FIXER_STAGES = {"triage", "search", "plan", "reproduce", "fix", "pr"}
REDIS_URL = "redis://:$(BATON_REDIS_PASSWORD)@baton-redis:6379/0"
MI_B = 1024 * 1024
METRICS_PORT = 9808
"""`BATON_METRICS_PORT` by convention (workers.settings)."""
PROMETHEUS_NAMESPACE = "monitoring"
"""The namespace whose pods may scrape the workers (k8s/README.md, "Network policies")."""
SERVE_PORT = 8080
HEALTH_PATH = "/api/v1/health"
"""`baton serve`'s probe: it answers without a login, while Redis answers."""
WORKER_SECRETS = {"GOOGLE_API_KEY", "BATON_GITHUB_TOKEN"}
"""Keys of `baton-secrets` that only workers may get."""

Doc = dict[str, Any]


# -- the loader: what `kustomize build k8s/` produces, for the features k8s/ uses -------------


def kustomization() -> Doc:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def env_file(name: str) -> dict[str, str]:
    """A generator's env file, as its committed example shows it (the operator's own file, with
    the real values, is never read)."""
    pairs = {}
    for line in (K8S / f"{name}.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value
    return pairs


def render() -> list[Doc]:
    spec = kustomization()
    docs = [
        doc
        for resource in spec["resources"]
        for doc in yaml.safe_load_all((K8S / resource).read_text())
        if doc
    ]
    for generator in spec.get("secretGenerator", []):
        data = {}
        for name in generator["envs"]:
            data.update(env_file(name))
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": generator["name"]},
                "type": "Opaque",
                "data": encoded,
            }
        )
    for doc in docs:
        metadata = doc["metadata"]
        if doc["kind"] != "Namespace":
            metadata["namespace"] = spec["namespace"]
        for label in spec.get("labels", []):
            metadata.setdefault("labels", {}).update(label["pairs"])
            if label.get("includeTemplates") and "template" in doc.get("spec", {}):
                doc["spec"]["template"]["metadata"]["labels"].update(label["pairs"])
            for claim in doc.get("spec", {}).get("volumeClaimTemplates", []):
                claim["metadata"].setdefault("labels", {}).update(label["pairs"])
        for _, container in containers(doc):
            container["image"] = renamed(container["image"], spec.get("images", []))
    return docs


def renamed(image: str, rules: list[Doc]) -> str:
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    for rule in rules:
        if rule["name"] == name:
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    return image


def containers(doc: Doc) -> Iterator[tuple[str, Doc]]:
    """(`init` or `main`, container) of a workload's pod template."""
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("initContainers", []):
        yield "init", container
    for container in pod.get("containers", []):
        yield "main", container


RENDERED = render()


def of_kind(kind: str) -> list[Doc]:
    return [doc for doc in RENDERED if doc["kind"] == kind]


def named(kind: str, name: str) -> Doc:
    (doc,) = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    return doc


def workloads() -> list[Doc]:
    return of_kind("Deployment") + of_kind("StatefulSet")


def workers() -> dict[str, Doc]:
    """Worker Deployments by the stage they serve."""
    return {
        doc["spec"]["template"]["metadata"]["labels"]["baton.dev/stage"]: doc
        for doc in of_kind("Deployment")
        if doc["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


def container(doc: Doc, name: str) -> Doc:
    (found,) = [c for _, c in containers(doc) if c["name"] == name]
    return found


def sidecars(doc: Doc) -> list[Doc]:
    return [c for kind, c in containers(doc) if kind == "init" and c.get("restartPolicy")]


def env(c: Doc) -> dict[str, Doc]:
    return {var["name"]: var for var in c.get("env", [])}


def config_data() -> dict[str, str]:
    return named("ConfigMap", "baton-config")["data"]


def metrics_port() -> int:
    return int(config_data()["BATON_METRICS_PORT"])


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, values = expr["key"], expr.get("values", [])
        holds = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }
        if not holds[expr["operator"]]:
            return False
    return True


def pod_labels() -> list[dict[str, str]]:
    return [doc["spec"]["template"]["metadata"]["labels"] for doc in workloads()]


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / MI_B, "G": 1e9 / MI_B}
    match = re.fullmatch(r"([\d.]+)([A-Za-z]*)", quantity)
    assert match, quantity
    return float(match[1]) * units.get(match[2], 1 / MI_B)


def stage_spec(stage: str) -> StageSpec:
    return load_pipeline("fixer").stage(stage)


# -- schemas -----------------------------------------------------------------------------------


def core_ids() -> list[tuple[str, Doc]]:
    return [
        (f"{doc['kind']}/{doc['metadata']['name']}", doc)
        for doc in RENDERED
        if not doc["apiVersion"].startswith("keda.sh/")
    ]


@pytest.mark.parametrize("doc", [d for _, d in core_ids()], ids=[i for i, _ in core_ids()])
def test_every_core_object_validates_strictly_against_the_kubernetes_schemas(doc: Doc) -> None:
    used = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert used == KUBERNETES_VERSION


def test_the_custom_resources_are_keda_scaled_objects_and_one_trigger_authentication() -> None:
    custom = [doc for doc in RENDERED if doc["apiVersion"].startswith("keda.sh/")]
    assert {doc["apiVersion"] for doc in custom} == {KEDA_API}
    kinds = [doc["kind"] for doc in custom]
    assert sorted(kinds) == ["ScaledObject"] * len(FIXER_STAGES) + ["TriggerAuthentication"]


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
    assert worker["args"] == ["worker", "--stages", stage, "--concurrency", "2"]


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_the_grace_period_outlasts_the_stage_hard_time_limit(stage: str) -> None:
    grace_s = workers()[stage]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s == 660
    assert grace_s >= stage_spec(stage).budget.time_limit_s + 30


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_code_stages_have_a_docker_sidecar_and_tool_less_stages_have_none(stage: str) -> None:
    deployment = workers()[stage]
    worker = container(deployment, "worker")
    privileged = [
        c for _, c in containers(deployment) if c.get("securityContext", {}).get("privileged")
    ]
    if not stage_spec(stage).tools:
        assert stage in ("triage", "plan")
        assert not privileged and "initContainers" not in deployment["spec"]["template"]["spec"]
        assert "DOCKER_HOST" not in env(worker)
        return
    (dind,) = sidecars(deployment)
    assert privileged == [dind] and dind["image"].startswith("docker:") and "dind" in dind["image"]
    assert dind["restartPolicy"] == "Always"
    assert env(worker)["DOCKER_HOST"]["value"] == "unix:///var/run/dind/docker.sock"
    # The API is that socket only: no TCP listener another container could reach.
    hosts = [arg for arg in dind["args"] if arg.startswith(("--host", "-H"))]
    assert dind["args"][0] == "dockerd" and hosts == ["--host=unix:///var/run/dind/docker.sock"]
    mounts = {m["mountPath"]: m["name"] for m in dind["volumeMounts"]}
    worker_mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    assert mounts["/var/run/dind"] == worker_mounts["/var/run/dind"]
    assert "/var/lib/docker" in mounts and "/var/lib/docker" not in worker_mounts


@pytest.mark.parametrize("stage", ["search", "fix", "pr"])
def test_the_sandbox_image_is_pulled_into_the_sidecar_before_the_worker_starts(stage: str) -> None:
    init = [c for kind, c in containers(workers()[stage]) if kind == "init"]
    assert [c["name"] for c in init] == ["dind", "sandbox-image"]
    pull = init[1]
    assert pull["command"] == ["docker", "pull", "$(BATON_SANDBOX_IMAGE)"]
    assert env(pull)["BATON_SANDBOX_IMAGE"]["valueFrom"]["configMapKeyRef"] == {
        "name": "baton-config",
        "key": "BATON_SANDBOX_IMAGE",
    }
    assert env(pull)["DOCKER_HOST"]["value"] == "unix:///var/run/dind/docker.sock"
    worker = container(workers()[stage], "worker")
    assert {"configMapRef": {"name": "baton-config"}} in worker["envFrom"]


@pytest.mark.parametrize("stage", ["search", "fix", "pr"])
def test_the_sidecar_memory_holds_every_sandbox_the_worker_may_run_at_once(stage: str) -> None:
    deployment = workers()[stage]
    concurrency = int(container(deployment, "worker")["args"][-1])
    sandbox_mb = int(config_data()["BATON_SANDBOX__MEMORY_MB"])
    (dind,) = sidecars(deployment)
    limit_mb = mebibytes(dind["resources"]["limits"]["memory"])
    assert limit_mb >= concurrency * sandbox_mb + 256


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_worker_probes_read_the_health_file_and_forgive_missed_touches(stage: str) -> None:
    worker = container(workers()[stage], "worker")
    touch_every_s = float(config_data()["BATON_QUEUE__RECONCILE_EVERY_S"])
    assert config_data()["BATON_HEALTH_FILE"] == "/tmp/baton-alive"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = worker[probe]["exec"]["command"]
        assert "BATON_HEALTH_FILE" in command[-1]
        (max_age_s,) = re.findall(r"> (\d+)\)$", command[-1])
        assert float(max_age_s) >= 3 * touch_every_s
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
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
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


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_only_the_publishing_stage_gets_the_github_token(stage: str) -> None:
    worker = container(workers()[stage], "worker")
    publishes = "publish" in stage_spec(stage).tools
    assert publishes == (stage == "pr")
    assert ("BATON_GITHUB_TOKEN" in env(worker)) == publishes
    assert env(worker)["GOOGLE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "baton-secrets"


# -- KEDA --------------------------------------------------------------------------------------


def scaled_objects() -> dict[str, Doc]:
    """ScaledObjects by the stage of the Deployment they scale."""
    by_name = {doc["metadata"]["name"]: stage for stage, doc in workers().items()}
    found = {}
    for scaled in of_kind("ScaledObject"):
        assert scaled["apiVersion"] == KEDA_API
        target = scaled["spec"]["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment"
        assert target["name"] in by_name, f"{target['name']} is no worker Deployment"
        found[by_name[target["name"]]] = scaled
    return found


def test_every_worker_deployment_has_exactly_one_scaled_object() -> None:
    assert len(of_kind("ScaledObject")) == len(workers())
    assert set(scaled_objects()) == FIXER_STAGES


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_each_scaled_object_watches_its_stage_queue_in_baton_redis(stage: str) -> None:
    (trigger,) = scaled_objects()[stage]["spec"]["triggers"]
    assert trigger["type"] == "redis"
    meta = trigger["metadata"]
    assert meta["listName"] == stage_spec(stage).queue == f"baton.{stage}"
    concurrency = container(workers()[stage], "worker")["args"][-1]
    assert meta["listLength"] == concurrency
    assert meta["activationListLength"] == "0"
    assert meta["databaseIndex"] == REDIS_URL.rsplit("/", 1)[1] == "0"
    host, port = meta["address"].split(":")
    service, namespace, svc = host.split(".")
    assert (namespace, svc) == (NAMESPACE, "svc")
    assert [p["port"] for p in named("Service", service)["spec"]["ports"]] == [int(port)]
    auth = named("TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "baton-secrets", "key": "BATON_REDIS_PASSWORD"}
    ]


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_scale_down_waits_longer_than_a_stage_may_run(stage: str) -> None:
    spec = scaled_objects()[stage]["spec"]
    limit_s = stage_spec(stage).budget.time_limit_s
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert spec["cooldownPeriod"] > limit_s
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > limit_s
    assert 0 <= spec["minReplicaCount"] < spec["maxReplicaCount"]


def test_one_stage_never_scales_to_zero_so_the_reconciler_always_runs() -> None:
    minimum = {stage: doc["spec"]["minReplicaCount"] for stage, doc in scaled_objects().items()}
    assert minimum == {"triage": 1, "search": 0, "plan": 0, "reproduce": 0, "fix": 0, "pr": 0}


# -- Redis, Flower, serve, secrets -------------------------------------------------------------


def redis_clients() -> list[Doc]:
    return [c for doc in workloads() for _, c in containers(doc) if "BATON_REDIS_URL" in env(c)]


def test_every_redis_client_builds_the_same_url_from_the_secret_password() -> None:
    clients = redis_clients()
    assert len(clients) == len(FIXER_STAGES) + 2  # the workers, Flower and serve
    for client in clients:
        names = [var["name"] for var in client["env"]]
        assert env(client)["BATON_REDIS_URL"]["value"] == REDIS_URL
        # $(VAR) expands only variables defined before it.
        assert names.index("BATON_REDIS_PASSWORD") < names.index("BATON_REDIS_URL")
        assert env(client)["BATON_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "baton-secrets",
            "key": "BATON_REDIS_PASSWORD",
        }
    service = named("Service", "baton-redis")
    assert service["spec"]["ports"][0]["port"] == 6379


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
    command = script.split("<<")[0].replace("\\\n", " ").split()
    assert command[:3] == ["exec", "redis-server", "-"]  # configuration on stdin, then flags
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert flags["--appendonly"] == "yes" and flags["--appendfsync"] == "everysec"
    assert flags["--maxmemory-policy"] == "noeviction"
    assert 'requirepass "$REDISCLI_AUTH"' in script.splitlines()
    secret = env(server)["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "baton-secrets", "key": "BATON_REDIS_PASSWORD"}
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
    assert secrets == {"BATON_FLOWER_USER", "BATON_FLOWER_PASSWORD", "BATON_REDIS_PASSWORD"}


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
        "BATON_REDIS_PASSWORD": {"name": "baton-secrets", "key": "BATON_REDIS_PASSWORD"},
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
    for line in (K8S / "serve.env.example").read_text().splitlines():
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
    for key in values:
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


def test_every_pod_goes_without_service_links_and_service_account_token() -> None:
    for doc in workloads():
        pod = doc["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False, doc["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, doc["metadata"]["name"]


def test_every_container_but_the_docker_sidecar_runs_unprivileged() -> None:
    for doc in workloads():
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for _, c in containers(doc):
            if c["name"] == "dind":
                continue
            context = c["securityContext"]
            non_root = context.get("runAsNonRoot", pod["securityContext"].get("runAsNonRoot"))
            assert non_root is True, c["name"]
            assert context["allowPrivilegeEscalation"] is False, c["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, c["name"]
            assert "resources" in c and "limits" in c["resources"], c["name"]


def test_the_namespace_admits_the_privileged_docker_sidecar_in_so_many_words() -> None:
    labels = named("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_baton_containers_run_the_image_make_images_builds_renamed_by_kustomize() -> None:
    (rule,) = kustomization()["images"]
    assert (rule["name"], rule["newTag"]) == ("baton", "0.1.0")
    roles = ("worker", "flower", "serve")
    baton = [c for doc in workloads() for _, c in containers(doc) if c["name"] in roles]
    assert len(baton) == len(FIXER_STAGES) + 2
    assert {c["image"] for c in baton} == {f"{rule['newName']}:0.1.0"}
    for manifest in ("worker-fix.yaml", "flower.yaml", "serve.yaml"):
        assert "image: baton:0.1.0" in (K8S / manifest).read_text(), manifest


# -- cross-references --------------------------------------------------------------------------


def test_every_workload_selector_matches_its_own_pod_template() -> None:
    for doc in workloads():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selects(doc["spec"]["selector"], labels), doc["metadata"]["name"]


def test_every_service_selects_the_pods_of_some_workload() -> None:
    for service in of_kind("Service"):
        selector = {"matchLabels": service["spec"]["selector"]}
        assert any(selects(selector, labels) for labels in pod_labels()), service["metadata"]


REF_KINDS = {
    "secretKeyRef": "Secret",
    "secretRef": "Secret",
    "configMapKeyRef": "ConfigMap",
    "configMapRef": "ConfigMap",
}


class Reference(NamedTuple):
    """A Secret or ConfigMap something refers to: one key of it, or all (`key` None)."""

    kind: str
    name: str
    key: str | None
    optional: bool = False
    """The pod starts without it (`optional: true`): a key the operator may leave out."""


def container_references(c: Doc) -> Iterator[Reference]:
    for var in c.get("env", []):
        for ref_kind, ref in var.get("valueFrom", {}).items():
            if ref_kind in REF_KINDS:
                optional = ref.get("optional", False)
                yield Reference(REF_KINDS[ref_kind], ref["name"], ref["key"], optional)
    for source in c.get("envFrom", []):
        for ref_kind, ref in source.items():
            if ref_kind in REF_KINDS:
                yield Reference(REF_KINDS[ref_kind], ref["name"], None)


def references() -> Iterator[Reference]:
    """Every Secret and ConfigMap something refers to."""
    for doc in workloads():
        for _, c in containers(doc):
            yield from container_references(c)
        for volume in doc["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in volume:
                yield Reference("Secret", volume["secret"]["secretName"], None)
            if "configMap" in volume:
                yield Reference("ConfigMap", volume["configMap"]["name"], None)
    for auth in of_kind("TriggerAuthentication"):
        for ref in auth["spec"].get("secretTargetRef", []):
            yield Reference("Secret", ref["name"], ref["key"])


def test_every_secret_and_config_map_reference_names_a_key_the_kustomization_defines() -> None:
    found = list(references())
    assert {(ref.kind, ref.name) for ref in found} == {
        ("Secret", "baton-secrets"),
        ("Secret", "baton-flower-auth"),
        ("Secret", "baton-serve-auth"),
        ("ConfigMap", "baton-config"),
    }
    for ref in found:
        doc = named(ref.kind, ref.name)
        if ref.key is not None and not ref.optional:
            assert ref.key in doc["data"], f"{ref.kind} {ref.name} has no key {ref.key}"
    # An optional key is still one the example shows (maybe commented out), for the operator.
    generated = {gen["name"]: gen["envs"] for gen in kustomization()["secretGenerator"]}
    for ref in found:
        if ref.optional:
            lines = [
                line.lstrip("#")
                for name in generated[ref.name]
                for line in (K8S / f"{name}.example").read_text().splitlines()
            ]
            assert any(line.startswith(f"{ref.key}=") for line in lines), ref


def test_worker_secrets_reach_worker_containers_only() -> None:
    for doc in workloads():
        for _, c in containers(doc):
            if c["name"] == "worker":
                continue
            secrets = [ref for ref in container_references(c) if ref.kind == "Secret"]
            assert all(ref.key is not None for ref in secrets), f"{c['name']}: a whole Secret"
            leaked = {ref.key for ref in secrets} & WORKER_SECRETS
            assert not leaked, f"{c['name']} gets {leaked}"
            assert not set(env(c)) & WORKER_SECRETS, c["name"]


def test_network_policy_selectors_match_real_pods() -> None:
    for policy in of_kind("NetworkPolicy"):
        spec = policy["spec"]
        if spec["podSelector"]:
            assert any(selects(spec["podSelector"], labels) for labels in pod_labels())
        for rule in spec.get("ingress", []) + spec.get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    assert any(selects(peer["podSelector"], labels) for labels in pod_labels())


def test_the_namespace_denies_all_traffic_unless_a_policy_allows_it() -> None:
    deny = named("NetworkPolicy", "baton-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def peers_and_ports(policy: str, direction: str) -> tuple[list[Doc], set[tuple[str, int]]]:
    rules = named("NetworkPolicy", policy)["spec"].get(direction, [])
    peers = [peer for rule in rules for peer in rule.get("from", []) + rule.get("to", [])]
    ports = {(p["protocol"], p["port"]) for rule in rules for p in rule.get("ports", [])}
    return peers, ports


def test_redis_accepts_only_workers_flower_serve_and_keda_on_its_port() -> None:
    peers, ports = peers_and_ports("baton-redis", "ingress")
    local = [p["podSelector"]["matchLabels"] for p in peers if "namespaceSelector" not in p]
    components = {labels["app.kubernetes.io/component"] for labels in local}
    assert components == {"worker", "flower", "serve"}
    keda = [p for p in peers if "namespaceSelector" in p]
    assert [p["namespaceSelector"]["matchLabels"] for p in keda] == [
        {"kubernetes.io/metadata.name": "keda"}
    ]
    assert ports == {("TCP", 6379)}


def policies_admitting(labels: dict[str, str]) -> list[str]:
    """NetworkPolicies that select pods with these labels and allow some ingress to them."""
    return [
        policy["metadata"]["name"]
        for policy in of_kind("NetworkPolicy")
        if selects(policy["spec"]["podSelector"], labels) and policy["spec"].get("ingress")
    ]


def test_workers_reach_only_dns_redis_and_https_and_accept_only_metrics_scrapes() -> None:
    _, egress = peers_and_ports("baton-workers", "egress")
    assert egress == {("UDP", 53), ("TCP", 53), ("TCP", 6379), ("TCP", 443)}
    # One rule: the metrics port, from any pod of the Prometheus namespace, and nothing else.
    assert named("NetworkPolicy", "baton-workers")["spec"]["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
        }
    ]
    assert metrics_port() == METRICS_PORT
    for stage, deployment in workers().items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert policies_admitting(labels) == ["baton-workers"], stage
    _, flower_in = peers_and_ports("baton-flower", "ingress")
    _, flower_out = peers_and_ports("baton-flower", "egress")
    assert flower_in == {("TCP", 5555)}
    assert flower_out == {("UDP", 53), ("TCP", 53), ("TCP", 6379)}


@pytest.mark.parametrize(("component", "port"), [("flower", 5555), ("serve", SERVE_PORT)])
def test_web_pods_reach_only_dns_and_redis_and_accept_only_their_own_port(
    component: str, port: int
) -> None:
    policy = f"baton-{component}"
    peers_in, ports_in = peers_and_ports(policy, "ingress")
    peers_out, ports_out = peers_and_ports(policy, "egress")
    assert peers_in == [] and ports_in == {("TCP", port)}  # from anywhere, to this port only
    assert ports_out == {("UDP", 53), ("TCP", 53), ("TCP", 6379)}
    assert not any("ipBlock" in peer for peer in peers_out)
    labels = named("Deployment", policy)["spec"]["template"]["metadata"]["labels"]
    assert policies_admitting(labels) == [policy]


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


def test_the_kustomization_lists_every_manifest_and_only_existing_files() -> None:
    spec = kustomization()
    listed = spec["resources"]
    assert len(set(listed)) == len(listed)
    assert all((K8S / name).is_file() for name in listed)
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == manifests
    env_files = [name for gen in spec["secretGenerator"] for name in gen["envs"]]
    examples = {p.name.removesuffix(".example") for p in K8S.glob("*.example")}
    assert sorted(examples) == sorted(env_files) == ["flower.env", "secrets.env", "serve.env"]
    ignored = (K8S / ".gitignore").read_text().splitlines()
    assert all(name in ignored for name in env_files)
    # Nothing else: the env files themselves are the operator's, git-ignored.
    others = {"kustomization.yaml", "README.md", ".gitignore", *env_files}
    allowed = manifests | {f"{name}.example" for name in env_files} | others
    assert {p.name for p in K8S.iterdir()} <= allowed


def test_manifests_leave_the_namespace_to_the_kustomization() -> None:
    assert kustomization()["namespace"] == NAMESPACE
    assert [doc["metadata"]["name"] for doc in of_kind("Namespace")] == [NAMESPACE]
    for resource in kustomization()["resources"]:
        for doc in yaml.safe_load_all((K8S / resource).read_text()):
            assert "namespace" not in doc["metadata"], f"{resource}: {doc['metadata']['name']}"


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.skipif(kustomize_command() is None, reason="no kustomize or kubectl binary")
def test_kustomize_builds_the_objects_the_loader_renders(tmp_path: Path) -> None:
    build = tmp_path / "k8s"
    examples = [p.name for p in K8S.glob("*.example")]
    real = [name.removesuffix(".example") for name in examples]
    shutil.copytree(K8S, build, ignore=lambda _, names: [n for n in names if n in real])
    for example in examples:
        shutil.copy(build / example, build / example.removesuffix(".example"))
    command = kustomize_command()
    assert command is not None
    out = subprocess.run([*command, str(build)], capture_output=True, text=True, check=True)
    built = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in RENDERED
    )
    for doc in RENDERED:
        assert doc in built, f"kustomize renders {doc['kind']} {doc['metadata']['name']} otherwise"
