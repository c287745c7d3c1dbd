"""Configuration, results and errors: what they accept, say and survive."""

from __future__ import annotations

import os
import pickle

import docker
import pydantic
import pytest

import sandbox
from sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxError,
    SandboxFileError,
    SandboxStartError,
    SandboxUnavailableError,
    ensure_image,
)


def result(**changes: object) -> ExecResult:
    fields = {
        "exit_code": 0,
        "output": "",
        "timed_out": False,
        "oom_killed": False,
        "truncated": False,
        "duration_s": 0.1,
    }
    return ExecResult.model_validate({**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "status"),
    [
        ({}, "ok"),
        ({"exit_code": 1}, "failed"),
        ({"exit_code": 137}, "failed"),
        ({"exit_code": None, "timed_out": True}, "timeout"),
        ({"exit_code": 137, "oom_killed": True}, "oom"),
    ],
)
def test_status_tells_timeouts_and_oom_apart_from_failures(
    changes: dict[str, object], status: str
) -> None:
    assert result(**changes).status == status


def test_the_defaults_are_the_safe_ones() -> None:
    cfg = SandboxConfig()
    assert (cfg.image, cfg.network, cfg.user, cfg.memory_mb, cfg.pids_limit) == (
        "baton-sandbox:2",
        None,
        "1000:1000",
        1024,
        256,
    )
    assert (cfg.ttl_s, cfg.exec_timeout_s, cfg.max_output_bytes) == (1800, 120.0, 1_000_000)
    assert cfg.runtime is None  # dockerd's default, runc


@pytest.mark.parametrize(
    "changes",
    [
        {"network": "host"},
        {"network": "container:abc"},
        {"user": "0:0"},
        {"user": "root"},
        {"workspace": "relative"},
        {"workspace": "/tmp/ws"},
        {"memory_mb": 0},
        {"pids_limit": -1},
        {"privileged": True},
        {"runtime": "../runsc"},
        {"runtime": ""},
    ],
)
def test_unsafe_or_unknown_settings_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        SandboxConfig.model_validate(changes)


def test_a_config_cannot_be_changed_in_place() -> None:
    cfg = SandboxConfig()
    with pytest.raises(pydantic.ValidationError):
        cfg.memory_mb = 10**6  # type: ignore[misc]


ERRORS = [
    SandboxError("x"),
    SandboxStartError("the image is missing"),
    SandboxUnavailableError("dockerd is gone"),
    SandboxFileError("/x is too big"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_error_survives_pickling_with_its_message(error: SandboxError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.args) == (type(error), str(error), error.args)


def test_errors_are_also_the_matching_builtins() -> None:
    assert isinstance(SandboxStartError("x"), RuntimeError)
    assert isinstance(SandboxUnavailableError("x"), ConnectionError)
    assert isinstance(SandboxFileError("x"), OSError)


def test_the_public_names_are_exported() -> None:
    assert set(sandbox.__all__) >= {
        "SandboxConfig",
        "DockerSandbox",
        "ExecResult",
        "SandboxError",
        "SandboxStartError",
        "SandboxUnavailableError",
        "reap",
        "ensure_image",
        "IMAGE_TAG",
    }
    assert all(getattr(sandbox, name) is not None for name in sandbox.__all__)


def test_ensure_image_does_nothing_when_the_image_exists(
    docker_client: docker.DockerClient,
) -> None:
    assert ensure_image(client=docker_client) is False


def test_building_the_image_without_root_is_refused_clearly(
    docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxStartError, match="needs root"):
        ensure_image("baton-sandbox:never-built", client=docker_client)
