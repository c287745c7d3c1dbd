"""k8s/: least privilege, checked offline on what `kustomize build k8s/` renders.

Pod Security: every pod of the namespace `baton` meets the `restricted` profile, checked here
rule by rule; privileged containers run only in `baton-sandbox`, whose only workloads are the
code stages. Secrets: each reaches only the containers that use it, the GitHub token only the
pr stage's. Network policies: who reaches whom, across the two namespaces. Disk: every pod
requests the ephemeral storage it may fill.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis

from testkit.services import free_port
from tests.deploy.manifests import (
    CODE_STAGES,
    FIXER_STAGES,
    K8S,
    NAMESPACE,
    RENDERED,
    SANDBOX_NAMESPACE,
    Doc,
    container,
    containers,
    env,
    kustomization,
    kustomization_directories,
    mebibytes,
    named,
    namespace_of,
    namespaces,
    of_kind,
    pod_spec,
    selects,
    stage_spec,
    workers,
    workloads,
)

PSA = "pod-security.kubernetes.io"
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
"""The volume types the `restricted` profile allows (no hostPath, no NFS, …)."""
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}
WORKER_SECRETS = {"GOOGLE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "BATON_GITHUB_TOKEN"}
"""Keys only worker containers may get."""
PROMETHEUS_NAMESPACE = "monitoring"
"""The namespace whose pods may scrape the workers and Flower (k8s/README.md)."""
KEDA_NAMESPACE = "keda"
METRICS_PORT = 9808
PLACEHOLDER = "replace-with-"
"""How every password, key and secret in k8s/**/*.env.example begins."""


def enforced(namespace: str) -> str:
    return str(namespaces()[namespace]["metadata"]["labels"][f"{PSA}/enforce"])


# -- the namespaces ----------------------------------------------------------------------------


def test_the_namespaces_live_outside_the_kustomization_so_delete_k_keeps_them() -> None:
    assert set(namespaces()) == {NAMESPACE, SANDBOX_NAMESPACE}
    for namespace in namespaces().values():
        kubernetes_validate.validate(namespace, "1.30", strict=True)
    for directory in kustomization_directories():
        assert "namespaces.yaml" not in kustomization(directory)["resources"], directory
    assert of_kind("Namespace") == []
    assert {namespace_of(doc) for doc in RENDERED} == set(namespaces())


def test_the_baton_namespace_enforces_restricted_and_only_the_sandbox_one_allows_privilege() -> (
    None
):
    core = namespaces()[NAMESPACE]["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert core[f"{PSA}/{mode}"] == "restricted", mode
        assert core[f"{PSA}/{mode}-version"] == "v1.30", mode
    sandbox = namespaces()[SANDBOX_NAMESPACE]["metadata"]["labels"]
    assert sandbox[f"{PSA}/enforce"] == "privileged"
    assert sandbox[f"{PSA}/audit"] == "restricted"


# -- Pod Security: the restricted profile ------------------------------------------------------


def effective(pod: Doc, c: Doc, key: str) -> object:
    """A security setting of a container: its own, else the pod's."""
    return c.get("securityContext", {}).get(key, pod.get("securityContext", {}).get(key))


def restricted_violations(doc: Doc) -> list[str]:
    """The rules of Pod Security's `restricted` profile (Kubernetes 1.30) that a workload's pod
    template breaks, as `container: rule`.

    Baseline rules: no host namespaces (network, PID, IPC), no privileged container, no host
    ports, no hostPath (or other non-ephemeral, non-claimed) volume, no added capabilities but
    NET_BIND_SERVICE, the default /proc mount, no sysctls, no SELinux or AppArmor override.
    Restricted rules: every container (init and sidecars included) with
    `allowPrivilegeEscalation: false`, `runAsNonRoot: true` and no uid 0 (its own or the
    pod's), seccomp `RuntimeDefault` or `Localhost` (its own or the pod's), and capabilities
    dropping ALL.
    """
    pod = pod_spec(doc)
    found = [f"pod: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        found += [f"pod: volume {volume['name']} is {kind}" for kind in kinds - RESTRICTED_VOLUMES]
    pod_context = pod.get("securityContext", {})
    found += [f"pod: {key}" for key in ("sysctls", "seLinuxOptions") if key in pod_context]
    if pod_context.get("appArmorProfile", {}).get("type") == "Unconfined":
        found.append("pod: AppArmor unconfined")
    for _, c in containers(doc):
        found += [f"{c['name']}: {rule}" for rule in container_violations(pod, c)]
    return found


def container_violations(pod: Doc, c: Doc) -> list[str]:
    context = c.get("securityContext", {})
    found = []
    if context.get("privileged"):
        found.append("privileged")
    if any("hostPort" in port for port in c.get("ports", [])):
        found.append("hostPort")
    if context.get("procMount", "Default") != "Default":
        found.append("procMount")
    if (
        "seLinuxOptions" in context
        or context.get("appArmorProfile", {}).get("type") == "Unconfined"
    ):
        found.append("SELinux or AppArmor override")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation is not false")
    if effective(pod, c, "runAsNonRoot") is not True or effective(pod, c, "runAsUser") == 0:
        found.append("may run as root")
    seccomp = effective(pod, c, "seccompProfile") or {}
    assert isinstance(seccomp, dict)
    if seccomp.get("type") not in ALLOWED_SECCOMP:
        found.append("no RuntimeDefault or Localhost seccomp profile")
    capabilities = context.get("capabilities", {})
    if "ALL" not in capabilities.get("drop", []):
        found.append("capabilities not dropped")
    if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
        found.append("capabilities added")
    return found


def workload_ids(namespace: str) -> list[str]:
    return [d["metadata"]["name"] for d in workloads() if namespace_of(d) == namespace]


@pytest.mark.parametrize("name", workload_ids(NAMESPACE))
def test_every_pod_of_the_baton_namespace_meets_the_restricted_profile(name: str) -> None:
    assert enforced(NAMESPACE) == "restricted"
    (doc,) = [d for d in workloads() if d["metadata"]["name"] == name]
    assert restricted_violations(doc) == []


@pytest.mark.parametrize("stage", CODE_STAGES)
def test_in_a_code_stage_pod_only_the_docker_sidecar_needs_more_than_restricted(
    stage: str,
) -> None:
    """The check above is not blind: it finds the sidecar, and nothing else of these pods."""
    violations = restricted_violations(workers()[stage])
    assert {v.split(":")[0] for v in violations} == {"dind"}
    assert "dind: privileged" in violations


def test_privileged_containers_run_only_in_the_sandbox_namespace_which_holds_only_code_stages() -> (
    None
):
    for doc in workloads():
        privileged = [
            c["name"] for _, c in containers(doc) if c.get("securityContext", {}).get("privileged")
        ]
        if privileged:
            assert privileged == ["dind"], doc["metadata"]["name"]
            assert enforced(namespace_of(doc)) == "privileged", doc["metadata"]["name"]
    there = [doc for doc in RENDERED if namespace_of(doc) == SANDBOX_NAMESPACE]
    assert sorted(d["metadata"]["name"] for d in workloads() if d in there) == sorted(
        f"baton-worker-{stage}" for stage in CODE_STAGES
    )
    assert {stage for stage in FIXER_STAGES if stage_spec(stage).tools} == set(CODE_STAGES)
    # Besides them: their autoscalers, settings, Secrets and policies; no Service, no Redis.
    kinds = {doc["kind"] for doc in there}
    assert kinds == {
        "Deployment",
        "ScaledObject",
        "TriggerAuthentication",
        "ConfigMap",
        "Secret",
        "NetworkPolicy",
    }


@pytest.mark.parametrize("stage", CODE_STAGES)
def test_code_stage_pods_are_never_scheduled_on_a_node_that_runs_redis(stage: str) -> None:
    affinity = pod_spec(workers()[stage])["affinity"]
    (term,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["namespaceSelector"] == {}  # Redis's pods in whichever namespace
    redis = named("StatefulSet", "baton-redis")
    assert selects(term["labelSelector"], redis["spec"]["template"]["metadata"]["labels"])
    others = [d for d in workloads() if d is not redis]
    assert not any(
        selects(term["labelSelector"], d["spec"]["template"]["metadata"]["labels"]) for d in others
    )


def test_redis_keeps_its_volume_when_its_stateful_set_goes() -> None:
    redis = named("StatefulSet", "baton-redis")
    assert redis["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }


# -- Secrets -----------------------------------------------------------------------------------


def secret_keys(c: Doc) -> set[tuple[str, str]]:
    """(Secret, key) of every value a container takes from a Secret."""
    return {
        (ref["name"], ref["key"])
        for var in c.get("env", [])
        if (ref := var.get("valueFrom", {}).get("secretKeyRef"))
    }


def test_no_container_takes_a_whole_secret() -> None:
    for doc in workloads():
        for _, c in containers(doc):
            assert not any("secretRef" in source for source in c.get("envFrom", [])), c["name"]


def test_worker_secrets_reach_worker_containers_only() -> None:
    for doc in workloads():
        for _, c in containers(doc):
            if c["name"] == "worker":
                continue
            leaked = {key for _, key in secret_keys(c)} & WORKER_SECRETS
            assert not leaked, f"{doc['metadata']['name']}/{c['name']} gets {leaked}"
            assert not set(env(c)) & WORKER_SECRETS, c["name"]


@pytest.mark.parametrize("stage", sorted(FIXER_STAGES))
def test_only_the_publishing_stage_gets_the_github_token(stage: str) -> None:
    worker = container(workers()[stage], "worker")
    publishes = "publish" in stage_spec(stage).tools
    assert publishes == (stage == "pr")
    assert ("BATON_GITHUB_TOKEN" in env(worker)) == publishes
    assert env(worker)["GOOGLE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "baton-secrets"
    # Every provider's key (docs/models.md) from the same Secret; the others' optional, so a
    # fleet on Gemini alone starts without them.
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        reference = env(worker)[key]["valueFrom"]["secretKeyRef"]
        assert reference == {"name": "baton-secrets", "key": key, "optional": True}, key


def test_the_github_token_is_in_one_secret_of_the_sandbox_namespace_which_only_pr_reads() -> None:
    holding = [
        (namespace_of(s), s["metadata"]["name"])
        for s in of_kind("Secret")
        if "BATON_GITHUB_TOKEN" in s["data"]
    ]
    assert holding == [(SANDBOX_NAMESPACE, "baton-github")]
    readers = [
        (doc["metadata"]["name"], c["name"])
        for doc in workloads()
        for _, c in containers(doc)
        if any(name == "baton-github" for name, _ in secret_keys(c))
    ]
    assert readers == [("baton-worker-pr", "worker")]


# -- placeholders ------------------------------------------------------------------------------


def example_secrets() -> dict[str, str]:
    """Every password, key and secret of the committed env examples (commented ones too)."""
    values = {}
    for path in K8S.rglob("*.env.example"):
        for line in path.read_text().splitlines():
            key, equals, value = line.lstrip("#").partition("=")
            if equals and any(word in key for word in ("PASSWORD", "SECRET", "KEY", "TOKENS")):
                values[f"{path.relative_to(K8S)}:{key}"] = value
    return values


@pytest.mark.parametrize("stage", CODE_STAGES)
def test_only_the_builder_holds_the_gate_s_build_socket_and_the_egress_folder(stage: str) -> None:
    """In each code-stage pod the gate's build socket is on a volume only the gate and the
    builder mount; the egress folder only the builder and the daemon, at the path the gate
    lets a build bind; the worker hands builds over; the builder has no model key or token."""
    pod = named("Deployment", f"baton-worker-{stage}")
    mounts = {
        c["name"]: {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        for _, c in containers(pod)
    }
    assert {name for name, m in mounts.items() if "gate-build-socket" in m} == {
        "sandbox-gate", "builder",
    }  # fmt: skip
    assert {name for name, m in mounts.items() if "egress" in m} == {"dind", "builder"}
    assert mounts["dind"]["egress"] == mounts["builder"]["egress"] == "/run/baton-egress"
    gate = container(pod, "sandbox-gate")["args"]
    assert "--build-listen=/var/run/gate-build/docker.sock" in gate
    assert "--allow-egress-source=/run/baton-egress" in gate
    assert not any(a.startswith("--allow-network") for a in gate)
    builder, worker = env(container(pod, "builder")), env(container(pod, "worker"))
    assert builder["DOCKER_HOST"]["value"] == "unix:///var/run/gate-build/docker.sock"
    assert builder["BATON_BUILD__EGRESS_SOURCE"]["value"] == "/run/baton-egress"
    assert "GOOGLE_API_KEY" not in builder and "BATON_GITHUB_TOKEN" not in builder
    assert worker["BATON_BUILD__HANDOFF"]["value"] == "true"
    assert worker["DOCKER_HOST"]["value"] == "unix:///var/run/gate/docker.sock"


def test_every_example_secret_is_a_recognisable_placeholder() -> None:
    values = example_secrets()
    assert len(values) >= 5
    for where, value in values.items():
        assert PLACEHOLDER in value, where


def secret_data(name: str = "baton-secrets", namespace: str = NAMESPACE) -> dict[str, str]:
    """A Secret as the example env files and the generator's literals make it."""
    (secret,) = [
        s
        for s in of_kind("Secret")
        if s["metadata"]["name"] == name and namespace_of(s) == namespace
    ]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def redis_server_container() -> dict[str, Any]:
    return container(named("StatefulSet", "baton-redis"), "redis")


def redis_environment(chosen: dict[str, str]) -> dict[str, str]:
    """The Redis container's environment: each variable from its Secret's key, a value `chosen`
    gives a key instead of the example's; an optional key that no Secret has is left unset."""
    found = {}
    for name, var in env(redis_server_container()).items():
        ref = var["valueFrom"]["secretKeyRef"]
        data = {**secret_data(ref["name"]), **chosen}
        if ref["key"] in data:
            found[name] = data[ref["key"]]
        else:
            assert ref.get("optional"), f"{name}: no key {ref['key']} in {ref['name']}"
    return found


def redis_script(tmp_path: Path) -> list[str]:
    """Redis's start command, with the folder its ConfigMap is mounted at moved to where the
    ConfigMap's files are in this repository (kustomize makes the ConfigMap of them)."""
    server = redis_server_container()
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == "users"]
    return [part.replace(mount["mountPath"], str(K8S / "baton")) for part in server["command"]]


PASSWORDS = sorted(name for name in env(redis_server_container()) if name.endswith("_PASSWORD"))
"""Every password Redis's container is given: the admin's and each user's."""


def password_key(variable: str) -> dict[str, Any]:
    """The Secret key a password variable of Redis's container comes from."""
    ref: dict[str, Any] = env(redis_server_container())[variable]["valueFrom"]["secretKeyRef"]
    return ref


CHOSEN = {
    password_key(name)["key"]: f"{name.lower()}-0123456789"
    for name in PASSWORDS
    if not password_key(name).get("optional")
}
"""A password of the test's (16 characters or more) for each key, but the optional ones, which
the examples leave out."""


def start_redis_script(tmp_path: Path, chosen: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Redis's own script, run with a stand-in redis-server that shows what it was given."""
    stand_in = tmp_path / "redis-server"
    stand_in.write_text('#!/bin/sh\necho "args: $*"\ncat\n')
    stand_in.chmod(0o755)
    environment = {"PATH": f"{tmp_path}:/usr/bin:/bin", **redis_environment(chosen)}
    return subprocess.run(
        redis_script(tmp_path), env=environment, capture_output=True, text=True, timeout=10
    )


def test_redis_makes_every_user_of_the_acl_with_its_password_and_none_on_argv(
    tmp_path: Path,
) -> None:
    started = start_redis_script(tmp_path, CHOSEN)
    assert started.returncode == 0, started.stderr
    args, *config = started.stdout.splitlines()
    assert not any(password in args for password in CHOSEN.values())
    users = {line.split()[1]: line for line in config if line.startswith("user ")}
    acl_users = re.findall(r"^user (\S+)$", (K8S / "baton" / "redis-users.acl").read_text(), re.M)
    # Every user of the ACL but the operator's optional `cli`, whose key the example leaves out.
    assert "cli" in acl_users and set(users) == set(acl_users) - {"cli"}
    for user, line in users.items():
        variable = (
            "BATON_REDIS_PASSWORD" if user == "default" else f"BATON_REDIS_{user.upper()}_PASSWORD"
        )
        assert line.startswith(f"user {user} reset on >{CHOSEN[password_key(variable)['key']]} ")
    with_cli = start_redis_script(tmp_path, {**CHOSEN, "BATON_REDIS_CLI_PASSWORD": "c" * 16})
    assert "user cli reset on >cccccccccccccccc " in with_cli.stdout


@pytest.mark.parametrize("variable", PASSWORDS)
def test_redis_refuses_to_start_with_a_placeholder_short_or_unsafe_password(
    variable: str, tmp_path: Path
) -> None:
    key = password_key(variable)["key"]
    examples = {where.partition(":")[2]: value for where, value in example_secrets().items()}
    assert PLACEHOLDER in examples[key]
    for wrong, said in (
        (examples[key], "still holds the example placeholder"),
        ("", "is shorter than 16 characters"),
        ("a1b2c3d4e5f6a7b", "is shorter than 16 characters"),
        ("a1b2c3d4e5f6a7b8 +@all", "may hold only letters, digits"),
        ('a1b2c3d4e5f6a7b8"x', "may hold only letters, digits"),
    ):
        refused = start_redis_script(tmp_path, {**CHOSEN, key: wrong})
        assert refused.returncode == 1 and refused.stdout == "", (wrong, refused.stdout)
        lines = refused.stderr.splitlines()
        assert any(line.startswith(f"redis-users: {variable} {said}") for line in lines), lines
        assert wrong == "" or wrong not in refused.stderr  # never the value itself


def test_keda_logs_in_to_redis_as_a_user_that_may_only_read_the_queue_lengths(
    tmp_path: Path,
) -> None:
    """The manifest's Redis start script runs the real redis-server (only its data directory,
    port and the ConfigMap's folder moved to the test's), and a client logs in the way
    keda-auth.yaml says KEDA does."""
    real = shutil.which("redis-server")
    assert real is not None, "redis-server is not installed: run `make setup`"
    port = free_port()
    moved = tmp_path / "bin" / "redis-server"
    moved.parent.mkdir()
    moved.write_text(
        "#!/bin/sh\n"
        f'for a; do shift; [ "$a" = /data ] && a={tmp_path}; set -- "$@" "$a"; done\n'
        f'exec {real} "$@" --port {port}\n'
    )
    moved.chmod(0o755)
    proc = subprocess.Popen(
        redis_script(tmp_path),
        env={"PATH": f"{moved.parent}:/usr/bin:/bin", **redis_environment(CHOSEN)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    (auth,) = {json.dumps(a["spec"], sort_keys=True) for a in of_kind("TriggerAuthentication")}
    login = {ref["parameter"]: ref["key"] for ref in json.loads(auth)["secretTargetRef"]}
    values = {**secret_data(), **CHOSEN}
    keda = redis.Redis(
        port=port, username=values[login["username"]], password=values[login["password"]]
    )
    admin = redis.Redis(port=port, password=redis_environment(CHOSEN)["BATON_REDIS_PASSWORD"])
    queues = [
        trigger["metadata"]["listName"]
        for doc in of_kind("ScaledObject")
        for trigger in doc["spec"]["triggers"]
        if trigger["type"] == "redis"
    ]
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.ping()
                break
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "Redis did not start"
                time.sleep(0.05)
        assert len(queues) == len(FIXER_STAGES)
        admin.rpush(queues[0], "message")
        admin.set("run:1", "a run")
        assert keda.ping() is True
        assert [keda.llen(queue) for queue in queues] == [1] + [0] * (len(queues) - 1)
        for forbidden in (
            lambda: keda.lrange(queues[0], 0, -1),
            lambda: keda.get("run:1"),
            lambda: keda.llen("run:1"),
            lambda: keda.keys("*"),
            lambda: keda.delete(queues[0]),
            lambda: keda.config_get("requirepass"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                forbidden()
        assert admin.llen(queues[0]) == 1
    finally:
        keda.close()
        admin.close()
        proc.terminate()
        proc.wait(timeout=10)


# -- disk --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [d["metadata"]["name"] for d in workloads()])
def test_every_pod_requests_the_ephemeral_storage_it_may_fill(name: str) -> None:
    """A request below what the pod may write lets the scheduler promise a node's disk twice;
    each container asks for what it may use (requests = limits), and together they cover
    every emptyDir's sizeLimit (the kubelet evicts a pod over the sum of its limits)."""
    (doc,) = [d for d in workloads() if d["metadata"]["name"] == name]
    running = []
    for kind, c in containers(doc):
        resources = c["resources"]
        assert (
            resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"]
        ), c["name"]
        assert {"cpu", "memory"} <= set(resources["limits"]), c["name"]
        if kind == "main" or c.get("restartPolicy") == "Always":
            running.append(mebibytes(resources["limits"]["ephemeral-storage"]))
    on_disk = [
        mebibytes(v["emptyDir"]["sizeLimit"])
        for v in pod_spec(doc).get("volumes", [])
        if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
    ]
    assert sum(running) >= sum(on_disk)


# -- network policies --------------------------------------------------------------------------


def namespace_labels(namespace: str) -> dict[str, str]:
    """A namespace's labels as the API server has them (it adds `kubernetes.io/metadata.name`)."""
    known = namespaces().get(namespace, {"metadata": {"labels": {}}})
    return {**known["metadata"]["labels"], "kubernetes.io/metadata.name": namespace}


def peer_selects(peer: Doc, policy: Doc, namespace: str, labels: dict[str, str]) -> bool:
    """Whether a policy's `from`/`to` entry matches a pod with these labels in `namespace`."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], namespace_labels(namespace))
    else:
        in_namespace = namespace == namespace_of(policy)
    return in_namespace and selects(peer.get("podSelector", {}), labels)


def policy(name: str, namespace: str = NAMESPACE) -> Doc:
    return named("NetworkPolicy", name, namespace)


def peers(doc: Doc, direction: str) -> list[Doc]:
    rules = doc["spec"].get(direction, [])
    return [peer for rule in rules for peer in rule.get("from", []) + rule.get("to", [])]


def ports(doc: Doc, direction: str) -> set[tuple[str, int]]:
    rules = doc["spec"].get(direction, [])
    return {(p["protocol"], p["port"]) for rule in rules for p in rule.get("ports", [])}


def pods_matched(doc: Doc, direction: str) -> set[str]:
    """The workloads whose pods some peer of the policy matches, by name."""
    return {
        w["metadata"]["name"]
        for w in workloads()
        for peer in peers(doc, direction)
        if peer_selects(peer, doc, namespace_of(w), w["spec"]["template"]["metadata"]["labels"])
    }


def policies_admitting(workload: Doc) -> list[str]:
    """The NetworkPolicies of the workload's namespace that select its pods and allow some
    ingress to them."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return [
        p["metadata"]["name"]
        for p in of_kind("NetworkPolicy")
        if namespace_of(p) == namespace_of(workload)
        and selects(p["spec"]["podSelector"], labels)
        and p["spec"].get("ingress")
    ]


@pytest.mark.parametrize("namespace", [NAMESPACE, SANDBOX_NAMESPACE])
def test_each_namespace_denies_all_traffic_unless_a_policy_allows_it(namespace: str) -> None:
    deny = policy("baton-default-deny", namespace)["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_network_policy_selectors_match_real_pods() -> None:
    for doc in of_kind("NetworkPolicy"):
        here = [w for w in workloads() if namespace_of(w) == namespace_of(doc)]
        spec = doc["spec"]
        if spec["podSelector"]:
            templates = [w["spec"]["template"]["metadata"]["labels"] for w in here]
            assert any(selects(spec["podSelector"], labels) for labels in templates)
        for direction in ("ingress", "egress"):
            for peer in peers(doc, direction):
                outside = peer.get("namespaceSelector", {}).get("matchLabels", {})
                if outside.get("kubernetes.io/metadata.name") in (KEDA_NAMESPACE, "kube-system"):
                    continue  # other people's pods
                if "podSelector" in peer:
                    assert any(
                        peer_selects(
                            peer, doc, namespace_of(w), w["spec"]["template"]["metadata"]["labels"]
                        )
                        for w in workloads()
                    ), (doc["metadata"], peer)


def test_redis_accepts_every_worker_flower_serve_and_keda_on_its_port_and_nothing_else() -> None:
    redis = policy("baton-redis")
    assert pods_matched(redis, "ingress") == {
        *(f"baton-worker-{stage}" for stage in FIXER_STAGES),
        "baton-flower",
        "baton-serve",
    }
    keda = [p for p in peers(redis, "ingress") if "namespaceSelector" in p and "keda" in str(p)]
    assert [p["namespaceSelector"]["matchLabels"] for p in keda] == [
        {"kubernetes.io/metadata.name": KEDA_NAMESPACE}
    ]
    assert ports(redis, "ingress") == {("TCP", 6379)}
    assert policies_admitting(named("StatefulSet", "baton-redis")) == ["baton-redis"]


@pytest.mark.parametrize("namespace", [NAMESPACE, SANDBOX_NAMESPACE])
def test_workers_reach_only_dns_redis_and_https_and_accept_only_metrics_scrapes(
    namespace: str,
) -> None:
    workers_policy = policy("baton-workers", namespace)
    assert ports(workers_policy, "egress") == {
        ("UDP", 53),
        ("TCP", 53),
        ("TCP", 6379),
        ("TCP", 443),
    }
    # Inside the cluster, Redis's pods and nothing else of Baton's.
    assert pods_matched(workers_policy, "egress") == {"baton-redis"}
    # One rule: the metrics port, from any pod of the Prometheus namespace, and nothing else.
    assert workers_policy["spec"]["ingress"] == [
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
    here = [d for stage, d in workers().items() if namespace_of(d) == namespace]
    assert here
    for deployment in here:
        assert policies_admitting(deployment) == ["baton-workers"]


def test_only_the_code_stages_builders_add_plain_http_to_public_addresses() -> None:
    builders = policy("baton-builders", SANDBOX_NAMESPACE)
    assert builders["spec"]["policyTypes"] == ["Egress"]
    assert ports(builders, "egress") == {("TCP", 80)}
    blocks = [peer["ipBlock"] for rule in builders["spec"]["egress"] for peer in rule["to"]]
    assert {b["cidr"] for b in blocks} == {"0.0.0.0/0", "::/0"}
    for block in blocks:  # never the cluster, a private range or the metadata address
        assert {"169.254.0.0/16", "10.0.0.0/8"} <= set(block["except"]) or block["cidr"] == "::/0"
    assert not [d for d in RENDERED if d["kind"] == "NetworkPolicy"
                and d["metadata"]["name"] == "baton-builders"
                and namespace_of(d) != SANDBOX_NAMESPACE]  # fmt: skip


def test_flower_accepts_only_prometheus_and_serve_accepts_anyone_on_its_port() -> None:
    flower = policy("baton-flower")
    assert peers(flower, "ingress") == [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}
            }
        }
    ]
    assert ports(flower, "ingress") == {("TCP", 5555)}
    assert pods_matched(flower, "ingress") == set()  # none of Baton's own pods
    serve = policy("baton-serve")
    assert peers(serve, "ingress") == [] and ports(serve, "ingress") == {("TCP", 8080)}


@pytest.mark.parametrize("component", ["flower", "serve"])
def test_web_pods_reach_only_dns_and_redis(component: str) -> None:
    own = policy(f"baton-{component}")
    assert ports(own, "egress") == {("UDP", 53), ("TCP", 53), ("TCP", 6379)}
    assert not any("ipBlock" in peer for peer in peers(own, "egress"))
    assert pods_matched(own, "egress") == {"baton-redis"}
    assert policies_admitting(named("Deployment", f"baton-{component}")) == [f"baton-{component}"]
