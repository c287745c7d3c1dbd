"""Git on the host: the one way Baton runs it, telling a URL from a path, pinning a commit.

Every git command Baton runs on a host goes through `run_git` (or `git_output`, which raises
when git fails): the orchestrator pins the commit when a run is enqueued, the workers'
repository cache (`workers.mirrors`) clones, fetches and archives, publishing
(`workers.publish`) commits and pushes, and the demo, the benchmarks and the test kit make their
repositories. Git inside a sandbox runs there (`workers.tools.container`), under the same time
limit and as the same committer.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from orchestrator.core.errors import RepoError

LOCAL_GIT_TIMEOUT_S = 120.0
"""Time limit of a git command that stays on one machine (a checkout, a commit, a diff, an
archive of a commit the mirror holds), on the host or inside a sandbox."""
NETWORK_GIT_TIMEOUT_S = 900.0
"""Default time limit of a git command that may reach another host (clone, fetch, ls-remote,
push)."""
MAX_GIT_MESSAGE_CHARS = 1_000
"""How much of git's stderr an error message quotes (the end, where git says what failed)."""
COMMITTER = {"user.name": "Baton", "user.email": "baton@localhost"}
"""Who every commit Baton makes is by (`Baton <baton@localhost>`), as git configuration."""
GIT_MISSING = "git is not installed (or not on PATH); install git"
"""The message of every error raised because there is no git to run."""
_PICK_A_REF = (
    " (if its HEAD names a branch that does not exist, pick a branch, tag or commit with --ref)"
)
_FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
_SCP_LIKE = re.compile(r"[^/:]+:")  # `host:path` or `user@host:path`: git's rule for a URL
_NOT_A_REPOSITORY = "not a git repository"
"""What git says (in the C locale of `git_env`) about a folder in no repository."""


def git_env() -> dict[str, str]:
    """The whole environment of a git command: nothing from the caller but PATH and HOME.

    HOME stays, so git finds the user's own configuration (a credential helper for pushes);
    tokens and keys in the caller's environment never reach git or its hooks.
    """
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(Path.home()),
        "LANG": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
    }


def git_config_env(config: Mapping[str, str]) -> dict[str, str]:
    """`config` (key: value) as git reads it from its environment (`GIT_CONFIG_COUNT`,
    `GIT_CONFIG_KEY_n`, `GIT_CONFIG_VALUE_n`): never in argv, where `ps` would show it."""
    env = {"GIT_CONFIG_COUNT": str(len(config))}
    for n, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    return env


def run_git(
    args: Sequence[str],
    *,
    timeout_s: float = LOCAL_GIT_TIMEOUT_S,
    stdin: bytes | str = b"",
    config: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `git *args` without a shell in `git_env()` and `env` (git's own variables: a date,
    a folder), with `config` in its environment; its output is bytes. A failing command is
    returned, not raised.

    Raises `subprocess.TimeoutExpired` after `timeout_s` and `FileNotFoundError` without git.
    """
    env = {**git_env(), **(env or {}), **(git_config_env(config) if config else {})}
    return subprocess.run(
        ["git", *args],
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        env=env,
        check=False,
        capture_output=True,
        timeout=timeout_s,
    )


def git_said(result: subprocess.CompletedProcess[bytes]) -> str:
    """What git said about a failure: the end of its stderr (or stdout), trimmed."""
    text = (result.stderr or result.stdout or b"").decode(errors="replace").strip()
    return text[-MAX_GIT_MESSAGE_CHARS:] or f"exit code {result.returncode}"


def git_output_bytes(
    source: str,
    args: Sequence[str],
    *,
    timeout_s: float = LOCAL_GIT_TIMEOUT_S,
    stdin: bytes | str = b"",
    config: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    failed: str = "",
) -> bytes:
    """The stdout of `git *args`, a command on repository `source` that must succeed.

    Raises `RepoError` naming the repository (credentials hidden) and quoting git; `failed`
    replaces the start of that message, "git <command> of <repository> failed".
    """
    command = _command(args)
    try:
        result = run_git(args, timeout_s=timeout_s, stdin=stdin, config=config, env=env)
    except FileNotFoundError as exc:
        raise RepoError(GIT_MISSING) from exc
    except subprocess.TimeoutExpired as exc:
        raise RepoError(f"git {command} of {redact(source)} took over {timeout_s:g} s") from exc
    if result.returncode != 0:
        failed = failed or f"git {command} of {redact(source)} failed"
        raise RepoError(f"{failed}: {redact(git_said(result))}")
    return result.stdout


def git_output(
    source: str,
    args: Sequence[str],
    *,
    timeout_s: float = LOCAL_GIT_TIMEOUT_S,
    stdin: bytes | str = b"",
    config: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    failed: str = "",
) -> str:
    """`git_output_bytes` as text, stripped."""
    out = git_output_bytes(
        source, args, timeout_s=timeout_s, stdin=stdin, config=config, env=env, failed=failed
    )
    return out.decode(errors="replace").strip()


def is_url(repo: str) -> bool:
    """True for a URL (`https://…`, `file://…`, `git@host:path`), False for a local path."""
    return "://" in repo or bool(_SCP_LIKE.match(repo))


def repo_identity(repo: str) -> str:
    """What names the same repository however it is spelled, for comparing (never for git):
    `https://GitHub.com/o/Shop.git/`, `git@github.com:o/shop`, `ssh://git@github.com/o/shop`
    and `https://user@github.com/o/sh%6Fp` are all `github.com/o/shop`: no scheme, no user, no
    default port, no `.git` or trailing `/`, percent-escapes decoded, in lower case (hosts are,
    and the forges' paths are case-insensitive; erring toward one repository is the safe side
    of a rule that is stricter for a repository). A local path is its resolved path."""
    given = repo.strip()
    if not given:
        return given
    if not is_url(given):
        return str(Path(given).expanduser().resolve()).removesuffix(".git")
    if "://" not in given:  # scp-like `user@host:path`
        host, _, path = given.partition(":")
        given = f"ssh://{host}/{path.lstrip('/')}"
    parts = urlsplit(given)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port if parts.port not in (None, 22, 80, 443, 9418) else None
    except ValueError:  # not a number: no repository git could reach, compared as written
        return given.lower()
    path = re.sub(r"/+", "/", unquote(parts.path)).strip("/").removesuffix(".git").rstrip("/")
    where = f"{host}:{port}" if port else host
    return f"{where}/{path}".lower() if parts.scheme != "file" else f"file://{path}"


def repo_source(repo: str) -> str:
    """`repo` as git should see it: URLs unchanged, local paths absolute."""
    if not repo.strip():
        raise RepoError("the repository is empty; give a local path or a git URL")
    if is_url(repo):
        return repo
    return str(Path(repo).expanduser().resolve())


def resolve_commit(
    repo: str, ref: str = "HEAD", *, timeout_s: float = NETWORK_GIT_TIMEOUT_S
) -> str:
    """The full sha of `ref` in `repo`: a URL (`ls-remote`), or a local path (`rev-parse`),
    which must be the root of a repository (see `check_repository_root`)."""
    source = repo_source(repo)
    if is_url(source):
        return _resolve_remote(source, ref, timeout_s)
    check_repository_root(repo)
    rev_parse = ["-C", source, "rev-parse", "--verify", f"{ref}^{{commit}}"]
    failed = f"{ref!r} names no commit in {source}" + (_PICK_A_REF if ref == "HEAD" else "")
    return git_output(source, rev_parse, timeout_s=timeout_s, failed=failed)


def check_repository_root(path: str) -> None:
    """Raise `RepoError`, naming `path` first, unless it is the root of a git repository: the
    top of a working tree, or a bare repository's folder.

    A folder inside a repository is refused: git would answer for the enclosing repository, and
    a run would pin and work on that instead of the folder given.
    """
    folder = Path(repo_source(path))
    advice = "give the repository's root, or make it a repository with `git init`"
    if not folder.is_dir():
        what = "no such folder" if not folder.exists() else "not a folder"
        raise RepoError(f"{path}: {what}; give the root of a git repository (or its URL)")
    root = _enclosing_root(path, folder)
    if root is None:
        raise RepoError(f"{path}: not a git repository; {advice}")
    if root != folder:
        raise RepoError(
            f"{path}: not the root of a git repository (it is inside the repository whose "
            f"root is {root}); {advice}"
        )


def _enclosing_root(path: str, folder: Path) -> Path | None:
    """The root of the repository `folder` is in (itself, if it is one); None outside any."""
    found = _rev_parse(path, folder, "--is-bare-repository", "--absolute-git-dir")
    if found.returncode != 0:
        if _NOT_A_REPOSITORY in git_said(found):
            return None
        raise RepoError(f"{path}: git cannot read it: {git_said(found)}")
    bare, _, git_dir = found.stdout.decode(errors="replace").strip().partition("\n")
    if bare == "true":
        return Path(git_dir).resolve()
    top = _rev_parse(path, folder, "--show-toplevel")
    if top.returncode != 0:  # inside a working tree's .git folder, which has no top
        return Path(git_dir).resolve().parent
    return Path(top.stdout.decode(errors="replace").strip()).resolve()


def _rev_parse(path: str, folder: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return run_git(["-C", str(folder), "rev-parse", *args])
    except FileNotFoundError as exc:
        raise RepoError(GIT_MISSING) from exc
    except subprocess.TimeoutExpired as exc:
        raise RepoError(f"{path}: git rev-parse took over {LOCAL_GIT_TIMEOUT_S:g} s") from exc


def _resolve_remote(url: str, ref: str, timeout_s: float) -> str:
    if _FULL_SHA.fullmatch(ref):
        return ref.lower()  # ls-remote lists refs, not commits; a full sha is its own answer
    refs: dict[str, str] = {}
    for line in git_output(url, ["ls-remote", url, ref], timeout_s=timeout_s).splitlines():
        sha, _, name = line.partition("\t")
        refs[name] = sha
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"):
        if name in refs:
            return refs[name]
    hint = _PICK_A_REF if ref == "HEAD" else ""
    raise RepoError(f"{ref!r} names no branch, tag or ref in {redact(url)}{hint}")


def _command(args: Sequence[str]) -> str:
    """The git command in `args` (`clone`, `fetch`, …), past `-C <path>` and `-c <key=value>`."""
    rest = list(args)
    while len(rest) > 2 and rest[0] in ("-C", "-c"):
        rest = rest[2:]
    return rest[0] if rest else "(no command)"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without credentials: each of `secrets`, and any written into a URL
    (`https://user:token@host/…`)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"://[^/@\s]+@", "://***@", text)


DIRTY = "-dirty"
"""What a source stamp ends with when the code it names has uncommitted changes
(`source_stamp`)."""


def uncommitted(root: Path, paths: Sequence[str]) -> list[str]:
    """The files under `paths` (relative to the clone at `root`) that differ from HEAD or are
    untracked, as `git status --porcelain` names them; none outside a clone."""
    done = run_git(["-C", str(root), "status", "--porcelain", "--", *paths])
    if done.returncode != 0:
        return []
    return [line[3:] for line in done.stdout.decode(errors="replace").splitlines() if line]


def source_stamp(root: Path, paths: Sequence[str]) -> str:
    """The short sha of the clone at `root`, ending `-dirty` when any of `paths` has
    uncommitted changes (`uncommitted`); "unknown" outside a clone. What a results file records
    as its commit."""
    done = run_git(["-C", str(root), "rev-parse", "--short", "HEAD"])
    if done.returncode != 0:
        return "unknown"
    sha = done.stdout.decode().strip()
    return sha + DIRTY if uncommitted(root, paths) else sha


def code_digest(root: Path, paths: Sequence[str]) -> str:
    """A digest of what `paths` (relative to the clone at `root`; folders may end in `/`) hold
    at HEAD, from git's own object ids: equal for two commits exactly when those paths are the
    same in both. Read from HEAD's tree alone, so a shallow clone can tell it too; "unknown"
    outside a clone."""
    lines = []
    for path in sorted(paths):
        done = run_git(
            ["-C", str(root), "rev-parse", "--verify", "--quiet", f"HEAD:{path.rstrip('/')}"]
        )
        if done.returncode != 0 and run_git(["-C", str(root), "rev-parse", "HEAD"]).returncode != 0:
            return "unknown"
        object_id = done.stdout.decode().strip() if done.returncode == 0 else "-"
        lines.append(f"{path} {object_id}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]
