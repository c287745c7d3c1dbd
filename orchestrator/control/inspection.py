"""Reading a finished (or running) run back: what `baton show/diff/artifacts/log`, the REST API
and the web UI show.

Everything here reads the run store — the truth — and nothing else: a run that ended before any
viewer started reads the same as one watched live. The types are pydantic models so that the
CLI's `--json`, the API's responses and its OpenAPI document are one and the same shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.control.timeline import Span as Span  # re-exported: the API's and tests' name
from orchestrator.control.timeline import timeline as timeline
from orchestrator.core import keys
from orchestrator.core.delegation import MAX_DEPTH
from orchestrator.core.errors import ArtifactNotFoundError
from orchestrator.core.models import ArtifactRef, RunRecord, RunStatus, StageRecord
from orchestrator.core.store import RunStore
from orchestrator.core.subsessions import stage_session

DIFF_ARTIFACT = "workspace.diff"
"""The artifact a code stage leaves its change in."""

SCAN_BATCH = 500
"""Runs read per round trip while a filtered list looks for matches."""


# -- runs ------------------------------------------------------------------------------------


class RunSummary(BaseModel):
    """One line of the runs list."""

    run_id: str
    status: RunStatus
    pipeline: str
    repo: str
    issue: str
    """The issue's title."""
    current_stage: str | None
    reason: str | None
    created_at: float
    updated_at: float
    ended_at: float | None
    """When the run reached its terminal status (None while it goes on)."""
    requests: int
    """Model calls, all stages."""
    prompt_tokens: int
    output_tokens: int


class RunPage(BaseModel):
    """A page of the runs list, newest first."""

    runs: list[RunSummary]
    offset: int
    next_offset: int | None
    """Where the next page starts; None on the last page."""
    total: int
    """Runs in the store (of any status: filters do not change it)."""


def summarize(run: RunRecord) -> RunSummary:
    stages = run.stages.values()
    return RunSummary(
        run_id=run.id,
        status=run.status,
        pipeline=run.pipeline,
        repo=run.repo,
        issue=run.issue.title,
        current_stage=run.current_stage,
        reason=run.reason,
        created_at=run.created_at,
        updated_at=run.updated_at,
        ended_at=run.updated_at if run.status.is_terminal else None,
        requests=sum(s.requests for s in stages),
        prompt_tokens=sum(s.prompt_tokens_total for s in stages),
        output_tokens=sum(s.output_tokens for s in stages),
    )


def find_runs(
    store: RunStore,
    *,
    status: RunStatus | None = None,
    pipeline: str | None = None,
    repo: str | None = None,
    text: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> RunPage:
    """The runs that match every filter given, newest first, `limit` from `offset` on.

    `text` matches the run id, the issue's title and the repository, ignoring case. Without a
    filter a page costs one read of `limit` runs; with one, runs are read `SCAN_BATCH` at a
    time — only the fields the filters look at — until the page is full.
    """
    total = int(store.redis.zcard(keys.RUNS))
    if not (status or pipeline or repo or text):
        ids = store.redis.zrevrange(keys.RUNS, offset, offset + limit)  # one more: a next page?
        found = [run for _, run in store.get_each(ids[:limit]) if run is not None]
        more = len(ids) > limit
        return RunPage(
            runs=[summarize(r) for r in found],
            offset=offset,
            next_offset=offset + limit if more else None,
            total=total,
        )
    matched = _matching(store, status, pipeline, repo, text, enough=offset + limit + 1)
    page = matched[offset : offset + limit]
    runs = [run for _, run in store.get_each(page) if run is not None]
    return RunPage(
        runs=[summarize(r) for r in runs],
        offset=offset,
        next_offset=offset + limit if len(matched) > offset + limit else None,
        total=total,
    )


def _matching(
    store: RunStore,
    status: RunStatus | None,
    pipeline: str | None,
    repo: str | None,
    text: str | None,
    *,
    enough: int,
) -> list[str]:
    """Ids of the newest runs that match, until `enough` are found or no run is left; reads
    only the fields the filters look at."""
    needle = text.casefold() if text else None
    matched: list[str] = []
    start = 0
    while len(matched) < enough:
        ids = store.redis.zrevrange(keys.RUNS, start, start + SCAN_BATCH - 1)
        if not ids:
            break
        start += len(ids)
        with store.redis.pipeline(transaction=False) as pipe:
            for run_id in ids:
                pipe.hmget(keys.run(run_id), ["status", "meta", "issue"])
            rows = pipe.execute()
        for run_id, (run_status, meta, issue) in zip(ids, rows, strict=True):
            if run_status is None or (status and run_status != status.value):
                continue  # expired, or another status
            info = json.loads(meta) if pipeline or repo else {}
            if (pipeline and info["pipeline"] != pipeline) or (repo and info["repo"] != repo):
                continue
            if needle and not _mentions(needle, run_id, meta, issue):
                continue
            matched.append(run_id)
    return matched


def _mentions(needle: str, run_id: str, meta_json: str, issue_json: str) -> bool:
    if needle in run_id.casefold():
        return True
    if _JSON_PLAIN.fullmatch(needle) and needle not in (meta_json + issue_json).casefold():
        return False  # a needle JSON writes as it is cannot be in a field the text lacks
    if needle in str(json.loads(meta_json)["repo"]).casefold():
        return True
    return needle in str(json.loads(issue_json).get("title", "")).casefold()


_JSON_PLAIN = re.compile(r"[ !#-\[\]-~]*")
"""Text every JSON writer leaves as it is: printable ASCII but the quote and the backslash."""


# -- artifacts -------------------------------------------------------------------------------


class Artifact(BaseModel):
    """An artifact of a run, as listed: `name` is unique within the run (`fix/tests-after.log`)."""

    name: str
    stage: str
    size_bytes: int
    media_type: str
    sha256: str


def artifacts(run: RunRecord) -> list[Artifact]:
    """Every artifact the run's stages recorded, in pipeline order."""
    return [
        Artifact(
            stage=stage,
            name=ref.name,
            size_bytes=ref.size_bytes,
            media_type=ref.media_type,
            sha256=ref.sha256,
        )
        for stage, record in run.stages.items()
        for ref in record.artifacts.values()
    ]


def find_artifact(run: RunRecord, name: str) -> ArtifactRef:
    """The artifact called `name`: its full name (`fix/tests-after.log`), or its name within a
    stage when only one stage has one by that name.

    Raises:
        ArtifactNotFoundError: none is called that, or several stages have one; the message
            lists the run's artifacts.
    """
    refs = [ref for record in run.stages.values() for ref in record.artifacts.values()]
    for ref in refs:
        if ref.name == name:
            return ref
    short = [ref for ref in refs if ref.name.rpartition("/")[2] == name]
    if len(short) == 1:
        return short[0]
    names = ", ".join(ref.name for ref in refs) or "none"
    if short:
        raise ArtifactNotFoundError(
            f"run {run.id}: {len(short)} stages have an artifact {name!r}; name one of "
            + ", ".join(ref.name for ref in short)
        )
    raise ArtifactNotFoundError(f"run {run.id} has no artifact {name!r} (it has: {names})")


def change(run: RunRecord) -> ArtifactRef | None:
    """The run's change: the newest stage's `workspace.diff` (the published one, once a
    publishing stage ran; the fix's, else)."""
    found = None
    for record in run.stages.values():
        found = record.artifacts.get(DIFF_ARTIFACT, found)
    return found


def read_artifact(store: RunStore, ref: ArtifactRef) -> tuple[int, Iterator[bytes]]:
    """The artifact's size, and its bytes in chunks, never all in memory at once.

    Raises:
        ArtifactNotFoundError: it is gone (the run expired).
    """
    size = store.artifact_size(ref)
    if size is None:
        raise ArtifactNotFoundError(f"artifact {ref.name} of run {ref.run_id} has expired")
    return size, store.artifact_chunks(ref, size)


# -- outputs ---------------------------------------------------------------------------------


def output_names(store: RunStore, run: RunRecord) -> list[str]:
    """The run's recorded stage outputs, in pipeline order (`fix.1` and a branch's `fix#b2`
    after `fix`)."""
    recorded = [k for k in store.redis.hkeys(keys.outputs(run.id)) if not k.startswith("temp:")]
    order = list(run.stages)

    def position(key: str) -> tuple[int, str]:
        stage = re.split(r"[.#]", key, maxsplit=1)[0]  # `fix.1`, a branch's `fix#b2`
        return (order.index(stage) if stage in order else len(order), key)

    return sorted(recorded, key=position)


def output(store: RunStore, run: RunRecord, key: str) -> dict[str, Any]:
    """One stage's output (`fix`, or `fix.1` for a looped stage's first iteration).

    Raises:
        ArtifactNotFoundError: the run has no such output; the message lists those it has.
    """
    found = store.output(run.id, key)
    if found is None:
        have = ", ".join(output_names(store, run)) or "none yet"
        raise ArtifactNotFoundError(f"run {run.id} has no output {key!r} (it has: {have})")
    return found


# -- the audit stream as a transcript --------------------------------------------------------


PartKind = Literal["text", "thought", "call", "result"]


class Part(BaseModel):
    """One part of a model turn or a tool result."""

    kind: PartKind
    text: str = ""
    """The text of a text or thought part."""
    tool: str | None = None
    args: dict[str, Any] | None = None
    result: Any = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    output_tokens: int = 0
    """Candidates and thoughts."""
    cached_tokens: int = 0


class Entry(BaseModel):
    """One audit entry, read: who did what in which stage session, when."""

    id: str
    """The stream entry id: a cursor (`after=`) for the next page."""
    ts: float
    branch: str
    stage: str | None
    """None for an entry about the whole run (cancelled, resumed)."""
    attempt: int | None
    kind: str
    """`user_message`, `model_reply`, `tool_call`, `tool_result`, `compaction`, `error`, or a
    transition: `stage_begin`, `stage_done`, `stage_waiting`, `stage_failed`, …"""
    author: str | None = None
    parts: list[Part] = Field(default_factory=list)
    usage: Usage | None = None
    """On model turns: what the call cost."""
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    """A transition's own fields (`delay_s`, `reason`, `error`, …)."""
    depth: int = 0
    """Where the entry's session sits in its stage's delegation tree: 0 the stage's own, 1 a
    child's (`workers.delegate`), 2 a child's child."""


class EntryPage(BaseModel):
    entries: list[Entry]
    next_after: str | None
    """The id to pass as `after` for the next page; None when this page reached the end."""


def read_entry(raw: dict[str, str]) -> Entry:
    """An audit stream entry as stored (every value a string) made into an `Entry`.

    Built with `model_construct`: every field is made here from parsed JSON with its type's
    conversion, and validating 2,000 entries again would cost as much as reading them."""
    _, stage, attempt = _session(stage_session(raw.get("session", "")))
    try:
        data = json.loads(raw.get("data") or "{}")
    except ValueError:
        data = {"text": raw.get("data", "")}
    if not isinstance(data, dict):
        data = {"value": data}
    kind = raw.get("kind", "event")
    fields: dict[str, Any] = {
        "id": raw.get("id", ""),
        "ts": float(raw.get("ts") or 0.0),
        "branch": raw.get("branch", ""),
        "stage": raw.get("stage") or stage,
        "attempt": attempt,
        "kind": kind,
        "author": raw.get("author"),
        "parts": [],
        "usage": None,
        "error": None,
        "data": {},
        "depth": _depth(raw.get("depth", "")),
    }
    error = data.get("error")
    if kind == "user_message":
        fields["parts"] = [_part("text", text=str(data.get("text", "")))]
    elif "content" in data or "usage" in data:  # an ADK event of the stage's session
        fields["parts"] = _parts(data.get("content"))
        fields["usage"] = _usage(data.get("usage"))
        fields["error"] = str(error) if error is not None else None
    else:
        fields["data"] = data
        fields["error"] = error if isinstance(error, str) else None
    return Entry.model_construct(**fields)


def _depth(stored: str) -> int:
    """A child's entry's depth as stored; 0 for a stage's own (no depth) or a value that is not
    one, and never more than delegation allows."""
    return min(int(stored), MAX_DEPTH) if stored.isdigit() else 0


def _session(session: str) -> tuple[str, str | None, int | None]:
    """`<run>:<stage>:<attempt>` split, or a branch's `<run>:<stage>:<branch>:<attempt>`
    (`orchestrator.core.branches`), whose stage is the part before its branch; the run-level
    `<run>:-:0` has no stage."""
    run_id, _, rest = session.partition(":")
    stage, _, attempt = rest.rpartition(":")
    if _BRANCH_SESSION.fullmatch(stage):
        stage = stage.rpartition(":")[0]
    if not stage or stage == "-":
        return run_id, None, None
    return run_id, stage, int(attempt) if attempt.isdigit() else None


_BRANCH_SESSION = re.compile(r"[^:]+:b[0-9]+")
"""What stands before the attempt in a branch's session id: `<stage>:<branch>`."""


def _parts(content: Any) -> list[Part]:
    parts = []
    found = content.get("parts") if isinstance(content, dict) else None
    for part in found if isinstance(found, list) else []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("function_call"), dict):
            call = part["function_call"]
            args = call.get("args") or {}
            parts.append(
                _part("call", tool=_name(call), args=args if isinstance(args, dict) else {"": args})
            )
        elif isinstance(part.get("function_response"), dict):
            reply = part["function_response"]
            parts.append(_part("result", tool=_name(reply), result=reply.get("response")))
        elif part.get("text"):
            parts.append(
                _part("thought" if part.get("thought") else "text", text=str(part["text"]))
            )
    return parts


def _part(
    kind: PartKind, *, text: str = "", tool: str | None = None, args: Any = None, result: Any = None
) -> Part:
    return Part.model_construct(kind=kind, text=text, tool=tool, args=args, result=result)


def _name(call: dict[str, Any]) -> str | None:
    name = call.get("name")
    return None if name is None else str(name)


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) else 0

    return Usage.model_construct(
        prompt_tokens=count("prompt_token_count"),
        output_tokens=count("candidates_token_count") + count("thoughts_token_count"),
        cached_tokens=count("cached_content_token_count"),
    )


def read_audit(
    store: RunStore,
    run_id: str,
    *,
    stage: str | None = None,
    after: str | None = None,
    limit: int = 500,
) -> EntryPage:
    """Up to `limit` audit entries after the entry `after` (from the start without it), oldest
    first; with `stage`, only that stage's."""
    entries: list[Entry] = []
    cursor = f"({after}" if after else "-"
    while len(entries) < limit:
        raw = store.redis.xrange(keys.audit(run_id), min=cursor, count=max(limit, 100))
        if not raw:
            return EntryPage(entries=entries, next_after=None)
        for entry_id, fields in raw:
            if stage is None or _stage_of(fields) == stage:  # before parsing the rest
                entries.append(read_entry(dict(fields, id=entry_id)))
                if len(entries) == limit:
                    more = store.redis.xrange(keys.audit(run_id), min=f"({entry_id}", count=1)
                    return EntryPage(entries=entries, next_after=entry_id if more else None)
        cursor = f"({raw[-1][0]}"
    return EntryPage(entries=entries, next_after=None)


def whole_audit(
    store: RunStore, run_id: str, *, stage: str | None = None, kinds: frozenset[str] | None = None
) -> list[Entry]:
    """Every audit entry of the run (or one stage's; or only those of some `kinds`), oldest
    first. Entries of other kinds are passed over before they are parsed."""
    found = []
    for entry_id, fields in store.redis.xrange(keys.audit(run_id)):
        if kinds is not None and fields.get("kind") not in kinds:
            continue
        if stage is None or _stage_of(fields) == stage:
            found.append(read_entry(dict(fields, id=entry_id)))
    return found


def _stage_of(fields: dict[str, str]) -> str | None:
    """The stage a stored entry belongs to, read without parsing its data."""
    return fields.get("stage") or _session(fields.get("session", ""))[1]


MODEL_TURNS = frozenset({"tool_call", "model_reply", "error", "compaction"})
"""The kinds of audit entry a model call returns (and whose usage says what it cost); a
`compaction` is the summary of a stage's older history (`workers.compaction`)."""
WAITS = frozenset({"stage_waiting"})
"""The kind of audit entry that records a rate-limit wait."""


# -- where the tokens went -------------------------------------------------------------------


class ModelCall(BaseModel):
    """One model call, from the audit entry of the turn it returned."""

    stage: str
    attempt: int | None
    ts: float
    made: str
    """What the reply did: `read_file, search_code` (tool calls), `reply`, or `summary` (a
    compaction's)."""
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int


class StageTokens(BaseModel):
    stage: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    prompt_tokens_max: int
    """The largest single request."""


class Tokens(BaseModel):
    stages: list[StageTokens]
    calls: list[ModelCall]
    prompt_tokens: int
    output_tokens: int


def tokens(run: RunRecord, entries: list[Entry]) -> Tokens:
    """Where the run's tokens went: per stage (from its record, which counts the attempt that
    made the output and every finished iteration) and per model call (from the audit)."""
    stages = [
        StageTokens(
            stage=name,
            requests=_sum_iterations(record, "requests"),
            prompt_tokens=_sum_iterations(record, "prompt_tokens_total"),
            output_tokens=_sum_iterations(record, "output_tokens"),
            prompt_tokens_max=record.prompt_tokens_max,
        )
        for name, record in run.stages.items()
    ]
    calls = [
        ModelCall(
            stage=entry.stage or "-",
            attempt=entry.attempt,
            ts=entry.ts,
            made=", ".join(p.tool or "?" for p in entry.parts if p.kind == "call")
            or ("summary" if entry.kind == "compaction" else "reply"),
            prompt_tokens=entry.usage.prompt_tokens,
            output_tokens=entry.usage.output_tokens,
            cached_tokens=entry.usage.cached_tokens,
        )
        for entry in entries
        if entry.usage is not None and entry.author != "user"
    ]
    return Tokens(
        stages=stages,
        calls=calls,
        prompt_tokens=sum(s.prompt_tokens for s in stages),
        output_tokens=sum(s.output_tokens for s in stages),
    )


def _sum_iterations(record: StageRecord, figure: str) -> int:
    """A looped stage's record holds the figures of its newest execution; each finished
    iteration's are in `iterations`. The record's own count only while an iteration after the
    last finished one is under way (it has started since)."""
    if not record.iterations:
        return int(getattr(record, figure))
    finished = sum(int(getattr(i, figure)) for i in record.iterations)
    last = record.iterations[-1]
    going = record.iteration > last.number and record.started_at != last.started_at
    return finished + (int(getattr(record, figure)) if going else 0)
