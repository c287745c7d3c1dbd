"""The pipelines that ship with Baton, each named by an entry point of the `baton.pipelines`
group (pyproject.toml) to its spec file here."""

from importlib import resources

FIXER = resources.files(__name__) / "fixer.toml"
"""The reference pipeline: an error report to a pull request."""
