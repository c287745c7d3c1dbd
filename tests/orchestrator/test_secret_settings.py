"""Every secret setting from a `<VARIABLE>_FILE` as well as from the variable, through one
settings source that every settings class of Baton uses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from orchestrator.control.flower import FlowerCredentials
from orchestrator.control.server.auth import ServeSettings
from orchestrator.core.errors import ConfigError
from orchestrator.core.secret_settings import is_secret, variables
from orchestrator.core.settings import BatonSettings, Settings
from workers.settings import WorkerSettings

SETTINGS_CLASSES = (Settings, WorkerSettings, ServeSettings, FlowerCredentials)
SECRET_VARIABLES = {
    "GOOGLE_API_KEY",
    "BATON_REDIS_URL",
    "BATON_GITHUB_TOKEN",
    "GITHUB_TOKEN",
    "BATON_SERVE_PASSWORD",
    "BATON_SERVE_SECRET",
    "BATON_SERVE_LOGINS",
    "BATON_SERVE_TOKENS",
    "BATON_FLOWER_PASSWORD",
}
"""The secrets Baton reads, as issue 22 and docs/redis.md name them."""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("BATON_", "GOOGLE_", "GITHUB_")):
            monkeypatch.delenv(name)


def secret_variables() -> dict[str, tuple[type[BatonSettings], str]]:
    """Every variable of a secret field of every settings class: its class and field."""
    found = {}
    for cls in SETTINGS_CLASSES:
        for name, field in cls.model_fields.items():
            if is_secret(field):
                for _, variable in variables(cls, name, field):
                    found[variable.upper()] = (cls, name)
    return found


def test_every_settings_class_of_baton_reads_secret_files() -> None:
    def subclasses(cls: type) -> set[type]:
        return {c for sub in cls.__subclasses__() for c in {sub, *subclasses(sub)}}

    assert subclasses(BatonSettings) == set(SETTINGS_CLASSES)
    assert SECRET_VARIABLES <= set(secret_variables())


@pytest.mark.parametrize("variable", sorted(SECRET_VARIABLES))
def test_each_secret_can_come_from_a_file(
    variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, field = secret_variables()[variable]
    complex_value = variable.endswith(("_LOGINS", "_TOKENS"))
    value = {"ana": "read:9f8e7d6c5b4a"} if complex_value else "s3cret value, with spaces"
    secret = tmp_path / "secret"
    secret.write_text((json.dumps(value) if complex_value else value) + "\n")  # as echo writes
    monkeypatch.setenv(f"{variable}_FILE", str(secret))

    read = getattr(cls(), field)

    if complex_value:
        assert {k: v.get_secret_value() for k, v in read.items()} == value
    elif isinstance(read, SecretStr):
        assert read.get_secret_value() == value
    else:
        assert read == value


def test_a_variable_and_its_file_both_set_are_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "key"
    secret.write_text("from-the-file")
    monkeypatch.setenv("GOOGLE_API_KEY_FILE", str(secret))
    monkeypatch.setenv("GOOGLE_API_KEY", "from-the-variable")
    with pytest.raises(ConfigError) as refused:
        Settings()
    assert str(refused.value) == (
        "GOOGLE_API_KEY_FILE and GOOGLE_API_KEY are both set; set only one"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("GOOGLE_API_KEY_FILE", "BATON_GOOGLE_API_KEY"),  # another name of the same setting
        ("GOOGLE_API_KEY_FILE", "BATON_GOOGLE_API_KEY_FILE"),
        ("BATON_SERVE_PASSWORD_FILE", "baton_serve_password"),  # another spelling
    ],
)
def test_any_two_sources_of_one_secret_are_refused(
    first: str, second: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef")
    monkeypatch.setenv(first, str(secret))
    monkeypatch.setenv(second, str(secret))
    cls = ServeSettings if "SERVE" in first else Settings
    with pytest.raises(ConfigError, match="are both set; set only one"):
        cls()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "which cannot be read: No such file or directory"),
        ("dir", "which cannot be read: Is a directory"),
        (b"\xff\xfe secret \xff", "which is not UTF-8 text"),
        (b"", "which is empty"),
        (b"\n", "which is empty"),
    ],
)
def test_a_secret_file_that_cannot_serve_is_refused_naming_the_variable_and_path_only(
    content: bytes | str | None, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    monkeypatch.setenv("BATON_FLOWER_PASSWORD_FILE", str(path))
    with pytest.raises(ConfigError) as refused:
        FlowerCredentials()
    assert str(refused.value) == f"BATON_FLOWER_PASSWORD_FILE names {path}, {said}"


def test_a_file_that_is_not_json_for_a_table_is_refused_without_its_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tokens"
    path.write_text("ci=read:the-token-itself")
    monkeypatch.setenv("BATON_SERVE_TOKENS_FILE", str(path))
    with pytest.raises(ConfigError) as refused:
        ServeSettings()
    assert str(refused.value) == f"BATON_SERVE_TOKENS_FILE names {path}, which does not hold JSON"


def test_a_bad_secret_is_never_echoed_by_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tokens"
    path.write_text(json.dumps({"ci": "no-scope-the-token-itself"}))
    monkeypatch.setenv("BATON_SERVE_TOKENS_FILE", str(path))
    with pytest.raises(ValidationError) as refused:
        ServeSettings()
    assert "'ci'" in str(refused.value)  # which entry
    assert "the-token-itself" not in str(refused.value)


def test_settings_that_are_no_secret_take_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model"
    path.write_text("gemini-from-a-file")
    monkeypatch.setenv("BATON_MODEL_FILE", str(path))
    monkeypatch.setenv("BATON_HEALTH_FILE", "/tmp/alive")  # a setting of its own
    settings = WorkerSettings()
    assert settings.model != "gemini-from-a-file"
    assert settings.health_file == Path("/tmp/alive")
