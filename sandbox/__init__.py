"""Ephemeral, hardened Docker sandboxes for code work. Imports nothing else from Baton.

    with DockerSandbox.start(SandboxConfig()) as box:
        result = box.exec(["python3", "-c", "print(1)"], timeout_s=10)

`ensure_image` is imported on first use, so that `python -m sandbox.image` runs the module
only once (runpy warns when a package imported it before running it as `__main__`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.config import IMAGE_TAG, SandboxConfig
from sandbox.docker import DockerSandbox
from sandbox.errors import (
    SandboxError,
    SandboxFileError,
    SandboxStartError,
    SandboxUnavailableError,
)
from sandbox.models import ExecResult
from sandbox.reaper import reap, remove_labelled

if TYPE_CHECKING:
    from sandbox.image import ensure_image

__all__ = [
    "IMAGE_TAG",
    "DockerSandbox",
    "ExecResult",
    "SandboxConfig",
    "SandboxError",
    "SandboxFileError",
    "SandboxStartError",
    "SandboxUnavailableError",
    "ensure_image",
    "reap",
    "remove_labelled",
]


def __getattr__(name: str) -> Any:
    if name == "ensure_image":
        from sandbox.image import ensure_image

        return ensure_image
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
