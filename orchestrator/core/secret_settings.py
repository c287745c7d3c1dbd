"""Secret settings: from a file as well as from a variable, and never an example's placeholder.

Docker and Kubernetes hand secrets to a container as files (`/run/secrets/…`, a mounted
Secret), which keeps them out of the environment that `docker inspect`, `/proc/<pid>/environ`
and crash reports show. So every secret setting `X` of every Baton settings class may instead be
given as `X_FILE`, the path of a file holding it (one trailing newline is dropped, as `echo`
writes one). Setting both is refused: which one wins would be a guess. A secret setting is a
field whose type holds a `SecretStr`, or one marked `FromFile` (the Redis URL, which may carry
a password).

`SecretFilesSource` does it, through pydantic-settings' public source interface
(`settings_customise_sources`); `orchestrator.core.settings.BatonSettings` puts it into every
settings class.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from orchestrator.core.errors import ConfigError

PLACEHOLDERS = ("change-me", "replace-with")
"""How the passwords and secrets of the example files (.env.example, k8s/*/*.env.example) begin:
a value that still does is refused, never used as a login."""
FILE_SUFFIX = "_FILE"


class FromFile:
    """Marks a field that is a secret though its type is not `SecretStr`:
    `Annotated[str | None, FromFile()]`."""


def refuse_placeholders(secrets: dict[str, str | None]) -> None:
    """Raises `ConfigError` naming each variable (`{name: value}`) still holding an example
    file's placeholder."""
    left = sorted(
        name for name, value in secrets.items() if value and value.startswith(PLACEHOLDERS)
    )
    if left:
        raise ConfigError(
            f"{', '.join(left)} still hold the example's placeholder; set secrets of your own "
            "(openssl rand -hex 24)"
        )


def is_secret(field: FieldInfo) -> bool:
    """Whether a settings field holds a secret: its type mentions `SecretStr` anywhere
    (`SecretStr | None`, `dict[str, SecretStr]`), or it is marked `FromFile`."""
    return any(isinstance(m, FromFile) for m in field.metadata) or _mentions_secret(
        field.annotation
    )


def _mentions_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    return any(_mentions_secret(arg) for arg in typing.get_args(annotation))


def variables(
    settings_cls: type[BaseSettings], name: str, field: FieldInfo
) -> list[tuple[str, str]]:
    """The environment variables a field is read from, as pydantic-settings reads them, each
    with the key its value goes under: each string choice of the field's `validation_alias`
    (the key is the alias), else the class's prefix and the field's name (the key is the
    name)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [(choice, choice) for choice in alias.choices if isinstance(choice, str)]
    if isinstance(alias, str):
        return [(alias, alias)]
    return [(name, f"{settings_cls.model_config.get('env_prefix', '')}{name}")]


class SecretFilesSource(PydanticBaseSettingsSource):
    """`X_FILE` for every secret field `X` of a settings class (variable names are matched
    without regard to case, as pydantic-settings matches them)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        environ = {key.upper(): value for key, value in os.environ.items()}
        self._values: dict[str, Any] = {}
        for name, field in settings_cls.model_fields.items():
            if not is_secret(field):
                continue
            found = _read(variables(settings_cls, name, field), environ)
            if found is None:
                continue
            key, file_variable, value = found
            if self.field_is_complex(field):  # a JSON object, as in the variable itself
                try:
                    value = self.decode_complex_value(name, field, value)
                except ValueError:
                    raise ConfigError(
                        f"{file_variable} names {environ[file_variable]}, which does not hold JSON"
                    ) from None
            self._values[key] = value

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        for key, _ in variables(self.settings_cls, field_name, field):
            if key in self._values:
                return self._values[key], key, False
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def _read(names: list[tuple[str, str]], environ: dict[str, str]) -> tuple[str, str, str] | None:
    """The key, the `X_FILE` variable and the secret of the one `X_FILE` set among a field's
    variables `names`; None if none is.

    Raises:
        ConfigError: when another of the field's variables, or its `_FILE`, is set too.
    """
    given = [(key, var.upper()) for key, var in names if f"{var.upper()}{FILE_SUFFIX}" in environ]
    if not given:
        return None
    key, variable = given[0]
    file_variable = f"{variable}{FILE_SUFFIX}"
    also = [var.upper() for _, var in names if var.upper() in environ]
    also += [f"{var}{FILE_SUFFIX}" for _, var in given[1:]]
    if also:
        raise ConfigError(f"{file_variable} and {', '.join(also)} are both set; set only one")
    return key, file_variable, read_secret_file(file_variable, environ[file_variable])


def read_secret_file(variable: str, path: str) -> str:
    """The secret in the file `path` that `variable` names, less one trailing newline.

    Raises:
        ConfigError: naming the variable and the path, never the contents, when the file
            cannot be read, is not UTF-8 text or holds nothing.
    """
    try:
        text = Path(path).read_bytes().decode()
    except OSError as exc:
        raise ConfigError(
            f"{variable} names {path}, which cannot be read: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{variable} names {path}, which is not UTF-8 text") from None
    value = text.removesuffix("\n").removesuffix("\r")
    if not value:
        raise ConfigError(f"{variable} names {path}, which is empty")
    return value
