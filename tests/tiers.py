"""How much each tier does where a test can do more or less: property tests' example counts.

`make test` runs every property test with the examples its decorator names. `make unit`, the
fast loop, loads the Hypothesis profile `unit` (`--hypothesis-profile=unit`), which runs a fifth
of them (at least ten): a relaxed setting, stated here and in the Makefile.
"""

from __future__ import annotations

from hypothesis import settings

FULL_EXAMPLES = 100
"""Hypothesis' own default `max_examples`: the scale the decorators' counts are written in."""
settings.register_profile("unit", max_examples=FULL_EXAMPLES // 5)


def examples(count: int) -> int:
    """`count` examples under the default profile; proportionally fewer (at least ten) under
    the `unit` profile."""
    active = settings.default.max_examples
    return count if active >= FULL_EXAMPLES else max(10, count * active // FULL_EXAMPLES)
