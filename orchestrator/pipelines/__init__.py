"""Baton's reference pipelines: `fixer.toml`, and `reviewer/` (its spec beside its schemas and
host tools)."""
