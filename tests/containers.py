"""A run's sandboxes, found the way an operator finds them: by name. A sandbox taken from a
worker's warm pool was started before its run existed, so only its name says whose it is."""

from __future__ import annotations

import subprocess

from sandbox.labels import SANDBOX_FILTER, name_pattern


def sandboxes(run_id: str, stage: str | None = None) -> list[str]:
    """Ids of the sandbox containers, running or not, of `run_id` (and `stage`)."""
    given = {"baton.run": run_id, **({"baton.stage": stage} if stage else {})}
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={SANDBOX_FILTER}",
         "--filter", f"name={name_pattern(given)}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return listed.stdout.split()
