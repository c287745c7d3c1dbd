"""The pipelines that ship with Baton, one folder each (`<name>/pipeline.toml` and its schemas
module), each named by an entry point of the `baton.pipelines` group (pyproject.toml) to its
spec file; and `schemas`: output schemas any pipeline may use."""

from importlib import resources

FIXER = resources.files(__name__) / "fixer" / "pipeline.toml"
"""The reference pipeline: an error report to a pull request."""

REVIEWER = resources.files(__name__) / "reviewer" / "pipeline.toml"
"""The second reference pipeline: a pull request to review comments posted on it."""

FIXER_PLUS = resources.files(__name__) / "fixer_plus" / "pipeline.toml"
"""The fixer as a graph: scored triage, search subagents, a gate by score, best-of-3 fix."""
