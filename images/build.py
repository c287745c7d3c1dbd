"""`make images`: the base image when it is missing, then `baton:<version>` when the source
changed, all without a registry.

    .venv/bin/python -m images.build [--force] [--mirror URL]

Python packages reach the image as wheels fetched on the host, at the versions and with the
hashes of requirements.lock (`images.lock`): of the lock, the image gets what Baton's service
needs (`baton[litellm]`) on the image's python, and pip in the image installs them with
`--require-hashes`. `build/wheels` caches the wheels; the package index is asked only when one
is not in it yet. Baton's own wheel is made from a clean copy of its source (so no stale file of
an old build gets in), with the venv's locked setuptools. The Docker build context holds just the
Dockerfile and those wheels. The image is labelled with a hash of Baton's source, the lock, the
Dockerfile and the base image, and is rebuilt only when that hash changes (or with `--force`);
the dependency layer is rebuilt only when the wheels it installs change.

Tags: `baton:<version>-<source>`, where `<source>` is a hash of what the image is made of (the
source, the Dockerfile, the base image's recipe version), so a changed source is a new tag and
no two builds ever share one; and `baton:<version>`, which follows the newest build, for
Compose on one host. `--registry R` also tags the image `R/baton:<version>-<source>` and writes
build/k8s/kustomization.yaml, an overlay of k8s/ that runs exactly that image (README, k8s).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import docker
import docker.errors
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from images import lock
from images.base import BASE_TAG, Progress, build_lock, ensure_base, image_id
from images.errors import ImageBuildError
from sandbox.client import connected
from sandbox.errors import SandboxError
from sandbox.image import DEFAULT_MIRROR, inspected, run_streaming, timed_printer

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "images" / "Dockerfile"
WHEEL_CACHE = ROOT / "build" / "wheels"
CONTEXT = ROOT / "build" / "images" / "context"
WHEEL_VENV = ROOT / "build" / "images" / "python"
HOST_PYTHON = "/usr/bin/python3"
"""Debian bookworm's python3: the interpreter the base image runs, so the wheels are chosen
for it (environment markers such as `python_full_version < "3.11.3"` depend on it)."""
SOURCES = ("pyproject.toml", "README.md", "orchestrator", "workers", "sandbox", "testkit", "demo")
"""What Baton's wheel is made of (pyproject.toml names README.md as its long description)."""
SERVICE_EXTRA = "litellm"
"""The extra of Baton's wheel the image installs: LiteLLM, so a worker of the image runs stages
on any provider. Of the lock, the image gets what Baton needs with it, and the locked pip and
setuptools (which a venv of Python 3.11 starts with, at the interpreter's own versions)."""
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
K8S = ROOT / "k8s"
K8S_OVERLAY = ROOT / "build" / "k8s"
SOURCE_LABEL = "org.baton.source-hash"
DISTRIBUTION = "baton"
VERSION_SCRIPT = "import platform; print(platform.python_version())"

__all__ = ["BASE_TAG", "SOURCE_LABEL", "ensure_images", "image_tag", "source_tag", "write_overlay"]


def image_tag() -> str:
    """`baton:<version>`, the version being the one in pyproject.toml: the newest build."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        return f"{DISTRIBUTION}:{tomllib.load(file)['project']['version']}"


def source_tag() -> str:
    """`baton:<version>-<source>`: the tag of the image this checkout makes (no Docker
    needed)."""
    with tempfile.TemporaryDirectory(prefix="baton-image-src-") as scratch:
        return _source_tag(_content(_copy_sources(Path(scratch) / "src")))


def _source_tag(content: str) -> str:
    return f"{image_tag()}-{content[:12]}"


def ensure_images(
    *,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    mirror: str = DEFAULT_MIRROR,
    force: bool = False,
) -> str:
    """Build what is missing or out of date; the tag of Baton's image. Builders on one host
    take turns (a lock), so concurrent callers build once."""
    say = progress or (lambda line: None)
    with connected(client) as docker_client, build_lock(say):
        ensure_base(docker_client, say, mirror=mirror)
        with tempfile.TemporaryDirectory(prefix="baton-image-src-") as scratch:
            source = _copy_sources(Path(scratch) / "src")
            content = _content(source)
            tag = _source_tag(content)
            digest = _built_from(content, base_id=image_id(docker_client, BASE_TAG) or "")
            if _label(docker_client, tag) == digest and not force:
                say(f"{tag} is up to date with the source (--force rebuilds it)")
                _tag(docker_client, tag, image_tag())
                return tag
            _prepare_context(source, _wheel_python(docker_client), say)
        replaced = image_id(docker_client, image_tag())
        _docker_build(docker_client, tag, digest, say)
        _tag(docker_client, tag, image_tag())
        if replaced is not None and replaced != image_id(docker_client, tag):
            _retire(docker_client, replaced)
    return tag


def write_overlay(image: str, directory: Path = K8S_OVERLAY) -> Path:
    """A kustomization in `directory` that is k8s/ with Baton's image replaced by `image`
    (`<registry>/baton:<version>-<source>`); its path."""
    name, _, tag = image.rpartition(":")
    directory.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(K8S, directory)
    path = directory / "kustomization.yaml"
    path.write_text(
        "# Written by `python -m images.build --registry ...`: k8s/ running the image built from\n"
        "# this checkout. `kubectl apply -k` this directory (k8s/README.md, Deploying).\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {base}\n"
        f"images:\n  - name: {DISTRIBUTION}\n    newName: {name}\n    newTag: {tag}\n"
    )
    return path


def _tag(client: docker.DockerClient, image: str, tag: str) -> None:
    repository, _, version = tag.rpartition(":")
    try:
        client.api.tag(image, repository, version, force=True)
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"could not tag {image} as {tag}: {exc}") from exc


def _copy_sources(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, dest / name, ignore=IGNORED)
        else:
            shutil.copy2(path, dest / name)
    return dest


def _content(source: Path) -> str:
    """A hash of what the image is made of: every file of the source copy (path and bytes),
    the lock, the Dockerfile and the base image's recipe version (`BASE_TAG`)."""
    sha = hashlib.sha256(BASE_TAG.encode())
    sha.update(DOCKERFILE.read_bytes())
    sha.update(lock.LOCK.read_bytes())
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        sha.update(str(path.relative_to(source)).encode() + b"\0")
        sha.update(path.read_bytes())
    return sha.hexdigest()


def _built_from(content: str, *, base_id: str) -> str:
    """The image's label: its content hash and the id of the base image it was built on (a
    rebuilt base, same recipe, is a rebuild too)."""
    return hashlib.sha256(f"{content}\0{base_id}".encode()).hexdigest()[:16]


def _label(client: docker.DockerClient, tag: str) -> str | None:
    found = inspected(client, tag)
    labels = (found["Config"].get("Labels") or {}) if found is not None else {}
    return labels.get(SOURCE_LABEL)


def _wheel_python(client: docker.DockerClient) -> Path:
    """A venv of the host's Debian python3 (build/images/python), checked to be the same
    version as the base image's: pip resolves the image's dependencies with it."""
    try:
        in_image = client.containers.run(
            BASE_TAG, ["python3", "-c", VERSION_SCRIPT], remove=True, network_mode="none"
        )
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"could not ask {BASE_TAG} for its python version: {exc}") from exc
    try:
        on_host = subprocess.run(
            [HOST_PYTHON, "-c", VERSION_SCRIPT], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        on_host = b"none"
    if on_host.strip() != in_image.strip():
        raise ImageBuildError(
            f"the wheels must be made by the python the image runs ({in_image.decode().strip()}"
            f"), but {HOST_PYTHON} is {on_host.decode().strip()}: build on Debian 12, or "
            "use images/Dockerfile.registry"
        )
    python = WHEEL_VENV / "bin" / "python"
    if not python.exists():
        made = subprocess.run([HOST_PYTHON, "-m", "venv", str(WHEEL_VENV)], check=False)
        if made.returncode != 0:
            raise ImageBuildError(
                f"`{HOST_PYTHON} -m venv` failed: apt-get install python3-venv, then try again"
            )
    return python


def _prepare_context(source: Path, python: Path, say: Progress) -> None:
    """build/images/context: the Dockerfile, wheels/app (Baton's wheel) and wheels/deps: the
    locked wheel of everything Baton's service needs on the image's python (`python`, which
    evaluates the lock's environment markers as the image will), and requirements.txt, which
    names each with its hashes from the lock."""
    shutil.rmtree(CONTEXT, ignore_errors=True)
    wheels = CONTEXT / "wheels"
    (wheels / "deps").mkdir(parents=True)
    shutil.copy2(DOCKERFILE, CONTEXT / "Dockerfile")
    app = _baton_wheel(source, wheels / "app", say)
    pins = lock.read()
    constraints = CONTEXT.parent / "constraints.txt"
    constraints.write_text("".join(f"{pin.constraint()}\n" for pin in pins.values()))
    wanted = [f"{app}[{SERVICE_EXTRA}]", "pip", "setuptools"]
    download = [str(python), "-m", "pip", "download", "--only-binary", ":all:", "--constraint",
                str(constraints), "--find-links", str(WHEEL_CACHE)]  # fmt: skip
    offline = [*download, "--no-index", "--dest", str(wheels / "deps"), *wanted]
    if _pip(offline, say, show=False, quiet=True) != 0:
        # Every locked file this python takes, each checked against its hash, and nothing
        # resolved against the index (--no-deps): a release newer than the lock changes nothing.
        # What the service needs is then chosen from these alone (`offline`).
        say("fetching the locked wheels from the package index into build/wheels")
        locked = CONTEXT.parent / "locked.txt"
        locked.write_text("".join(f"{pin.requirement()}\n" for pin in pins.values()))
        fetch = [str(python), "-m", "pip", "download", "--only-binary", ":all:", "--no-deps",
                 "--require-hashes", "--requirement", str(locked), "--progress-bar", "off",
                 "--dest", str(WHEEL_CACHE)]  # fmt: skip
        if _pip(fetch, say, show=True) != 0 or _pip(offline, say, show=False) != 0:
            raise ImageBuildError(
                "pip could not fetch the locked wheels (see above); is the package index "
                "reachable, and requirements.lock up to date (`make lock`)?"
            )
    # pip download copies the wheel it was given too; Baton's wheel never joins the cache.
    for copied in [*(wheels / "deps").glob(app.name), *WHEEL_CACHE.glob(app.name)]:
        copied.unlink()
    requirements = [_locked(wheel, pins) for wheel in sorted((wheels / "deps").glob("*.whl"))]
    (wheels / "deps" / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    say(f"context ready: Baton's wheel and {len(requirements)} locked dependency wheels")


def _baton_wheel(source: Path, dest: Path, say: Progress) -> Path:
    """Baton's wheel, made from `source` into `dest` with this venv's setuptools (the lock's:
    no build backend is fetched)."""
    say("making Baton's wheel")
    made = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(dest), str(source)]  # fmt: skip
    if _pip(made, say, show=False) != 0:
        raise ImageBuildError("pip could not make Baton's wheel (see above)")
    [wheel] = dest.glob(f"{DISTRIBUTION}-*.whl")
    return wheel


def _locked(wheel: Path, pins: dict[str, lock.Pin]) -> str:
    """The lock's `name==version --hash=...` of `wheel`, checked to be one of its files."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise ImageBuildError(f"{wheel.name} is not a wheel's name: {exc}") from exc
    pin = pins.get(name)
    if pin is None or Version(pin.version) != version:
        raise ImageBuildError(
            f"{wheel.name} is not in requirements.lock"
            + (f" (it pins {pin.name}=={pin.version})" if pin else "")
            + ": run `make lock`"
        )
    if not pin.matches(wheel):
        raise ImageBuildError(
            f"{wheel.name} is not a file of {pin.name}=={pin.version} as requirements.lock "
            "pins it (its sha256 differs): remove build/wheels and build again"
        )
    return pin.requirement()


def _pip(argv: list[str], say: Progress, *, show: bool, quiet: bool = False) -> int:
    """Run pip; its lines go to `say` when `show`, its last lines when it fails (unless
    `quiet`: the caller has another way)."""
    returncode, tail = run_streaming(argv, say if show else lambda line: None, keep=20)
    if returncode != 0 and not (show or quiet):
        for line in tail:
            say(f"pip: {line}")
    return returncode


def _docker_build(client: docker.DockerClient, tag: str, digest: str, say: Progress) -> None:
    """The classic builder, never pulling: FROM names the local base image."""
    started = time.monotonic()
    say(f"building {tag} from images/Dockerfile")
    try:
        for chunk in client.api.build(
            path=str(CONTEXT),
            tag=tag,
            pull=False,
            rm=True,
            forcerm=True,
            decode=True,
            buildargs={"BASE_IMAGE": BASE_TAG},
            labels={SOURCE_LABEL: digest},
        ):
            if "error" in chunk:
                raise ImageBuildError(f"docker build of {tag} failed: {chunk['error'].strip()}")
            for line in chunk.get("stream", "").splitlines():
                if line.strip():
                    say(line.rstrip())
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"docker build of {tag} failed: {exc}") from exc
    size_mb = client.api.inspect_image(tag)["Size"] / 1e6
    say(f"built {tag} ({size_mb:.0f} MB) in {time.monotonic() - started:.0f} s")


def _retire(client: docker.DockerClient, image: str) -> None:
    """The build a new one replaced: its source tags go, and with the last of them the image,
    unless a container still uses it (Docker then keeps it, tag and all)."""
    found = inspected(client, image)
    for tag in (found or {}).get("RepoTags") or []:
        if tag.startswith(f"{DISTRIBUTION}:"):
            try:
                client.api.remove_image(tag)
            except docker.errors.APIError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m images.build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"default: {DEFAULT_MIRROR}")
    parser.add_argument("--force", action="store_true", help="rebuild Baton's image anyway")
    parser.add_argument(
        "--registry",
        metavar="REGISTRY",
        help="also tag it REGISTRY/baton:<version>-<source> and write build/k8s, the overlay "
        "of k8s/ that runs it",
    )
    args = parser.parse_args(argv)
    say = timed_printer()
    try:
        tag = ensure_images(progress=say, mirror=args.mirror, force=args.force)
        if args.registry:
            pushed = f"{args.registry.rstrip('/')}/{tag}"
            with connected() as client:
                _tag(client, tag, pushed)
            overlay = write_overlay(pushed)
    except (ImageBuildError, SandboxError, docker.errors.DockerException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    say(f"images ready: {BASE_TAG}, {tag} (also {image_tag()})")
    if args.registry:
        say(f"next: docker push {pushed}; kubectl apply -k {overlay.parent.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
