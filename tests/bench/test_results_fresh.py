"""Every results file of this repository measured the code at HEAD (`python -m bench.stale`):
no commit after its own changed the code its figures depend on, and it was recorded from
committed code. Fails until the results are recorded afresh, on a clean tree."""

from __future__ import annotations

import pytest

from bench import stale

MAPPING = stale.measured()


@pytest.mark.parametrize("results", sorted(MAPPING))
def test_the_results_file_measured_the_code_at_head(results: str) -> None:
    found = stale.freshness(stale.ROOT, results, MAPPING[results])
    assert not found.stale, f"{results} (commit {found.commit}): {found.reason} {found.since[:5]}"
