"""Every Redis key Baton writes, in one place. All start with `baton:`.

A run's keys share the `baton:run:<id>` prefix so that one SCAN finds them all.
"""

from __future__ import annotations

PREFIX = "baton:"


def run(run_id: str) -> str:
    """Hash: the run record. Fields `meta`, `issue`, `status`, `reason`, `current_stage`,
    `updated_at` and one `stage:<name>` JSON document per stage."""
    return f"{PREFIX}run:{run_id}"


def outputs(run_id: str) -> str:
    """Hash: output key → the stage output (JSON). Keys starting `temp:` go when the run ends."""
    return f"{PREFIX}run:{run_id}:outputs"


def pipeline(run_id: str) -> str:
    """String: the pipeline spec the run pinned, as canonical JSON (`Pipeline.content`); its
    digest is the run's `pipeline_hash`."""
    return f"{PREFIX}run:{run_id}:pipeline"


def artifact(run_id: str, name: str) -> str:
    """String: the bytes of one artifact (a diff, a test log)."""
    return f"{PREFIX}run:{run_id}:artifact:{name}"


def audit(run_id: str) -> str:
    """Stream: the append-only audit log of every stage session's events."""
    return f"{PREFIX}run:{run_id}:audit"


def idempotency(key: str) -> str:
    """String: idempotency key → run id."""
    return f"{PREFIX}idem:{key}"


RUNS = f"{PREFIX}runs"
"""Sorted set: run id scored by creation time."""

ACTIVE = f"{PREFIX}active"
"""Set: ids of the runs not yet ended; the reconciler looks only at these."""

RECONCILER_LOCK = f"{PREFIX}lock:reconciler"
"""String with an expiry: held by the one worker sweeping for stuck runs."""


def consumers(queue: str) -> str:
    """Sorted set with an expiry: the workers that consume `queue`, each scored with the time
    (epoch seconds) its announcement lapses (`orchestrator.core.serving`)."""
    return f"{PREFIX}consumers:{queue}"


def stage_field(stage: str) -> str:
    """Field of the run hash that holds one stage's record."""
    return f"stage:{stage}"


def gate_field(gate: str) -> str:
    """Field of the run hash that holds one gate's record (`orchestrator.core.gates`)."""
    return f"gate:{gate}"


def quota(model: str) -> str:
    """Sorted set: the model calls of the last minute, fleet-wide (member `<id>:<tokens>`).

    `model` is the model id as stages name it (`orchestrator.core.providers`): a LiteLLM id carries
    its provider (`baton:quota:openai/gpt-4.1-mini`), a Gemini name holds no `/`, so two
    providers never share a quota; the same goes for `cooldown` and `quota_scale`."""
    return f"{PREFIX}quota:{model}"


def cooldown(model: str) -> str:
    """String with an expiry: no worker calls `model` until it is gone (set by a 429)."""
    return f"{PREFIX}cooldown:{model}"


def quota_scale(model: str) -> str:
    """Hash: the share of its configured quota the fleet believes `model` allows, lowered after
    a 429 (`low`, at Redis time `at_ms`) and recovering from there; gone once recovered."""
    return f"{PREFIX}quota-scale:{model}"


SERVE = f"{PREFIX}serve:"
"""`baton serve`'s keys: its login sessions, the browsers its users logged in from, and the
counters of failed logins. Every one names what it stands for by a SHA-256 digest, never by a
cookie's value, so that reading Redis gives nobody a cookie to send."""


def serve_session(digest: str) -> str:
    """String with an expiry: one login session (JSON: user, scope, the credential's
    fingerprint, expiry), by the digest of its cookie."""
    return f"{SERVE}session:{digest}"


def serve_browser(digest: str) -> str:
    """String with an expiry: the user who logged in from a browser, by the digest of that
    browser's cookie; its failed logins are counted apart from everybody else's."""
    return f"{SERVE}browser:{digest}"


def serve_failures(kind: str, digest: str) -> str:
    """Sorted set with an expiry: the failed logins of the last window (member a unique id,
    score the time in seconds) of one client address, user name or browser (`kind`)."""
    return f"{SERVE}failures:{kind}:{digest}"


def spend(run_id: str) -> str:
    """Hash: what the run's executions spent together (`orchestrator.core.spend`): `calls`,
    `tokens`, `cost_usd`, `uncosted:<model>` (calls of a model without a price) and, once a
    limit stopped it, `exceeded` (the reason)."""
    return f"{PREFIX}run:{run_id}:spend"


def kept_child(run_id: str, name: str) -> str:
    """String: the stored session of the run's kept child `name` (`orchestrator.core.children`),
    JSON. Under the run's prefix, so it expires and revives with the run."""
    return f"{PREFIX}run:{run_id}:child:{name}"


def kept_child_claim(run_id: str, name: str) -> str:
    """String with an expiry: the execution talking to the kept child `name` of the run now.
    Outside the run's prefix, so that a run's revival (which persists its keys) never makes a
    claim of a lost worker permanent: it lapses by itself."""
    return f"{PREFIX}child-claim:{run_id}:{name}"
