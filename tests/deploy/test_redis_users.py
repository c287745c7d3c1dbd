"""k8s/baton/redis-users.sh, the script that makes Redis's users in Compose and Kubernetes:
how it reads an ACL file, and the files it refuses (its password rules are checked on the
manifests' own scripts, in test_k8s_security.py and test_compose.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.manifests import K8S

SCRIPT = K8S / "baton" / "redis-users.sh"
ADMIN = {"BATON_REDIS_PASSWORD": "admin-0123456789ab"}


def users(acl: str, tmp_path: Path, **passwords: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "users.acl"
    path.write_text(acl)
    env = {"PATH": "/usr/bin:/bin", **ADMIN, **passwords}
    return subprocess.run(
        ["sh", str(SCRIPT), str(path)], env=env, capture_output=True, text=True, timeout=10
    )


def test_rules_blocks_are_taken_in_where_included_and_each_user_is_one_line(
    tmp_path: Path,
) -> None:
    acl = """# a comment
rules connect
  -@all +auth +ping

user default
  ~* &* +@all
user worker
  include connect
  # why: the queues
  ~baton.* +lpush
  (
    ~x:* +get
  )
"""
    made = users(acl, tmp_path, BATON_REDIS_WORKER_PASSWORD="worker-0123456789")
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [
        "user default reset on >admin-0123456789ab ~* &* +@all",
        "user worker reset on >worker-0123456789  -@all +auth +ping ~baton.* +lpush ( ~x:* +get )",
    ]


@pytest.mark.parametrize(
    ("acl", "said"),
    [
        ("user worker\n  +ping\n", "the ACL defines no `default` user"),
        ("user default\n  +@all\nuser worker\n  include nothing\n", "line 4: no `rules nothing`"),
        ("+ping\nuser default\n", "line 1: a rule outside any `user` or `rules` block"),
        ("user default\nuser default\n", "line 2: user default is defined twice"),
        ("user default\nuser Worker!\n", "line 2: expected `user <name>`"),
        ("user default\nuser worker extra\n", "line 2: expected `user <name>`"),
    ],
)
def test_a_malformed_acl_is_refused_naming_the_line(acl: str, said: str, tmp_path: Path) -> None:
    refused = users(acl, tmp_path, BATON_REDIS_WORKER_PASSWORD="worker-0123456789")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(f"redis-users: {said}"), refused.stderr


def test_without_the_admin_password_nothing_is_made(tmp_path: Path) -> None:
    path = tmp_path / "users.acl"
    path.write_text("user default\n  +@all\n")
    refused = subprocess.run(
        ["sh", str(SCRIPT), str(path)], env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert refused.returncode == 1 and refused.stdout == ""
    assert "BATON_REDIS_PASSWORD is not set" in refused.stderr
