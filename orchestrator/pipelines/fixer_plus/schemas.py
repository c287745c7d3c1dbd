"""Output schemas of `fixer-plus`: the fixer's, with a triage that scores how fixable the report
is. The score decides how far a run goes on its own (`[autonomy]` in `pipeline.toml`)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.pipelines.fixer.schemas import Triage


class ScoredTriage(Triage):
    """The fixer's triage and how likely a change to the code fixes the report."""

    fixability: float = Field(
        ge=0.0,
        le=1.0,
        description=(
            "From 0 to 1: how likely a small change to this repository's code fixes the report "
            "(1: a clear defect with a stack trace into the code; 0: not a code defect)."
        ),
    )
