"""Errors of the image builders."""

from __future__ import annotations


class ImageBuildError(RuntimeError):
    """Raised when an image cannot be built: debootstrap, pip or the Docker daemon failed, or
    a tool the build needs is missing. The message says which, and what to do."""
