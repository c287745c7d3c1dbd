"""What `workers.agent` relies on in google-adk beyond its public API, pinned (docs/upstream.md).

`workers.agent` marks `google.adk.agents.remote_a2a_agent` missing in `sys.modules` when the
`a2a` package is absent, so that ADK's import of it, tried at every run it builds, fails at once
instead of after running half the module. That changes nothing only while ADK's own import of
the module fails anyway without `a2a`; requirements.lock pins the google-adk it was checked with.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import importlib.util
print(importlib.util.find_spec("a2a") is not None)
try:
    import google.adk.agents.remote_a2a_agent
except ImportError as exc:
    print("ImportError", exc.name)
else:
    print("imported")
"""


def test_without_a2a_adks_remote_agent_module_cannot_be_imported_anyway() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "ImportError", "a2a"], done.stdout + done.stderr
