"""The run store: run records, stage outputs, artifacts and the audit log, on Redis.

Redis is the source of truth for run state. Every read-modify-write of a run is optimistic: the
record is read with its version, changed in Python, and written back by a script that first
checks the version is still the one read (else it is read again), so concurrent writers never
lose each other's changes. Two round trips, where WATCH/MULTI/EXEC needs three.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from orchestrator.core import keys
from orchestrator.core.connection import RedisConfig
from orchestrator.core.errors import RunNotFoundError
from orchestrator.core.models import (
    ArtifactRef,
    GateRecord,
    Issue,
    RunRecord,
    RunStatus,
    StageRecord,
)

logger = logging.getLogger(__name__)

MAX_AUDIT_ENTRY_CHARS = 64_000
"""An audit entry's data longer than this is cut, with a marker."""

Mutation = Callable[[RunRecord, Any], Any]
"""Changes a run in place; may queue commands on the pipeline it is given, to run in the same
atomic write (a redis-py pipeline, used only to record them)."""

VERSION_FIELD = "version"
"""The run hash's write counter: every write through `RunStore.transact` increments it."""

_WRITE_IF_UNCHANGED = """
-- KEYS[1]: the run hash. ARGV[1]: the version read ('' if none); ARGV[2]: the fields to set,
-- as a JSON object; ARGV[3]: further commands, as a JSON list of argument lists.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local version = redis.call('HGET', KEYS[1], 'version') or ''
if version ~= ARGV[1] then return 0 end
local fields = cjson.decode(ARGV[2])
local flat = {}
for name, value in pairs(fields) do
  flat[#flat + 1] = name
  flat[#flat + 1] = value
end
if #flat > 0 then redis.call('HSET', KEYS[1], unpack(flat)) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
for _, command in ipairs(cjson.decode(ARGV[3])) do
  redis.call(unpack(command))
end
return 1
"""
"""Writes a run's changed fields and the commands that go with them, if its version is still
the one read: 1 written, 0 changed meanwhile, -1 gone."""


class RunStore:
    """Reads and writes runs. Takes a connected client; owns no connection of its own."""

    def __init__(self, client: redis.Redis, *, ttl_s: int = 7 * 24 * 3600) -> None:
        # decode_responses=True makes every reply a str; redis-py's annotations cannot say so.
        self.redis: Any = client
        self.ttl_s = ttl_s
        self._write_if_unchanged = client.register_script(_WRITE_IF_UNCHANGED)

    @classmethod
    def from_url(cls, redis: RedisConfig | str, *, ttl_s: int = 7 * 24 * 3600) -> RunStore:
        """A store on `redis` (a URL alone: no CA file) that rides out a Redis restart: commands
        are retried with backoff for about 20 s before a connection error reaches the
        caller."""
        return cls(connect(redis), ttl_s=ttl_s)

    # -- runs --------------------------------------------------------------------------------

    def create(
        self, run: RunRecord, *, force: bool = False, pipeline_content: str | None = None
    ) -> tuple[RunRecord, bool]:
        """Store a new run, unless its idempotency key already names a live run; with it, the
        pipeline spec it pinned (`pipeline_content`, whose digest is `run.pipeline_hash`).

        Returns the run that now stands for the issue and whether it was created.
        """
        idem_key = keys.idempotency(run.idempotency_key)
        while True:
            existing = None if force else self.redis.get(idem_key)
            if existing and self.redis.exists(keys.run(existing)):
                return self.get(existing), False
            with self.redis.pipeline() as pipe:
                try:
                    pipe.watch(idem_key)
                    if not force and pipe.get(idem_key) != existing:
                        continue
                    pipe.multi()
                    pipe.set(idem_key, run.id)
                    pipe.hset(keys.run(run.id), mapping=run_fields(run))
                    if pipeline_content is not None:
                        pipe.set(keys.pipeline(run.id), pipeline_content)
                    pipe.zadd(keys.RUNS, {run.id: run.created_at})
                    pipe.sadd(keys.ACTIVE, run.id)
                    pipe.execute()
                except redis.WatchError:
                    continue
            return run, True

    def get(self, run_id: str) -> RunRecord:
        return _parse_run(run_id, self.redis.hgetall(keys.run(run_id)))

    def get_each(
        self,
        run_ids: Iterable[str],
        *,
        batch: int = 200,
        on_broken: Callable[[str, Exception], None] | None = None,
    ) -> Iterator[tuple[str, RunRecord | None]]:
        """Each run in order, None for one that no longer exists (expired), read `batch` runs
        per round trip; stop early to read no more. A record that cannot be read (corrupt) is
        handed to `on_broken` and left out; without `on_broken`, its error is raised."""
        ids = list(run_ids)
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            with self.redis.pipeline(transaction=False) as pipe:
                for run_id in chunk:
                    pipe.hgetall(keys.run(run_id))
                found = pipe.execute()
            for run_id, fields in zip(chunk, found, strict=True):
                if not fields:
                    yield run_id, None
                    continue
                try:
                    run = _parse_run(run_id, fields)
                except (ValueError, KeyError, TypeError) as exc:
                    if on_broken is None:
                        raise
                    on_broken(run_id, exc)
                    continue
                yield run_id, run

    def stage_state(self, run_id: str, stage: str) -> tuple[RunStatus, StageRecord | None]:
        """The run's status and one stage's record, in one round trip (no transaction)."""
        status, raw = self.redis.hmget(keys.run(run_id), ["status", keys.stage_field(stage)])
        if status is None:
            raise RunNotFoundError(run_id)
        return RunStatus(status), StageRecord.model_validate_json(raw) if raw else None

    def exists(self, run_id: str) -> bool:
        return bool(self.redis.exists(keys.run(run_id)))

    def transact(self, run_id: str, mutate: Mutation) -> Any:
        """Apply `mutate(run, pipe)` atomically and write back what changed.

        `mutate` changes the record in place and may queue more commands on `pipe`; they are
        written in the same atomic step. If another writer changed the run in between, it is
        read again and `mutate` called again. Its return value is returned.
        """
        key = keys.run(run_id)
        while True:
            before = self.redis.hgetall(key)
            run = _parse_run(run_id, before)
            with self.redis.pipeline(transaction=False) as pipe:
                result = mutate(run, pipe)
                commands = [[_arg(a) for a in args] for args, _options in pipe.command_stack]
            run.updated_at = time.time()
            changed = {k: v for k, v in run_fields(run).items() if before.get(k) != v}
            written = self._write_if_unchanged(
                keys=[key],
                args=[
                    before.get(VERSION_FIELD, ""),
                    json.dumps(changed, ensure_ascii=False),
                    json.dumps(commands, ensure_ascii=False),
                ],
            )
            if written == 1:
                return result
            if written == -1:
                raise RunNotFoundError(run_id)

    def pipeline_content(self, run_id: str) -> str | None:
        """The pipeline spec the run pinned (canonical JSON); None if it has none."""
        content: str | None = self.redis.get(keys.pipeline(run_id))
        return content

    def recent(self, limit: int = 50) -> list[str]:
        return list(self.redis.zrevrange(keys.RUNS, 0, limit - 1))

    def active(self) -> list[str]:
        """Ids of the runs that have not ended."""
        return sorted(self.redis.smembers(keys.ACTIVE))

    def retire(self, run: RunRecord) -> None:
        """After a run ended: drop its `temp:` outputs and start its expiry clock."""
        temp = [k for k in self.redis.hkeys(keys.outputs(run.id)) if k.startswith("temp:")]
        with self.redis.pipeline() as pipe:
            if temp:
                pipe.hdel(keys.outputs(run.id), *temp)
            for key in self._keys_of(run):
                pipe.expire(key, self.ttl_s)
            pipe.srem(keys.ACTIVE, run.id)
            pipe.execute()
        logger.info("run %s ended %s; %d temp outputs removed", run.id, run.status.value, len(temp))

    def revive(self, run: RunRecord, *, drop_outputs: Iterable[str] = ()) -> None:
        """Before a resumed run goes on: no expiry, active again, the outputs it will make again
        gone (so no later stage can read a stale one)."""
        with self.redis.pipeline() as pipe:
            for key in self._keys_of(run):
                pipe.persist(key)
            dropped = list(drop_outputs)
            if dropped:
                pipe.hdel(keys.outputs(run.id), *dropped)
            pipe.sadd(keys.ACTIVE, run.id)
            pipe.execute()

    def _keys_of(self, run: RunRecord) -> list[str]:
        extra = self.redis.scan_iter(match=keys.run(run.id) + ":*", count=500)
        return [keys.run(run.id), keys.idempotency(run.idempotency_key), *extra]

    # -- outputs -----------------------------------------------------------------------------

    def output(self, run_id: str, key: str) -> dict[str, Any] | None:
        raw = self.redis.hget(keys.outputs(run_id), key)
        return json.loads(raw) if raw else None

    def outputs(self, run_id: str, names: Iterable[str]) -> dict[str, Any]:
        names = list(names)
        if not names:
            return {}
        raw = self.redis.hmget(keys.outputs(run_id), names)
        return {n: json.loads(v) for n, v in zip(names, raw, strict=True) if v is not None}

    # -- artifacts ---------------------------------------------------------------------------

    def put_artifact(
        self, run_id: str, name: str, data: bytes, media_type: str = "text/plain"
    ) -> ArtifactRef:
        self.redis.set(keys.artifact(run_id, name), data)
        return ArtifactRef(
            run_id=run_id,
            name=name,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            media_type=media_type,
        )

    def artifact(self, ref: ArtifactRef) -> bytes:
        raw = self.redis.execute_command(
            "GET", keys.artifact(ref.run_id, ref.name), NEVER_DECODE=True
        )
        if raw is None:
            raise KeyError(f"artifact {ref.uri} is gone")
        data = bytes(raw)
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ValueError(f"artifact {ref.uri} does not match its recorded sha256")
        return data

    def artifact_size(self, ref: ArtifactRef) -> int | None:
        """The stored artifact's size in bytes; None if it is gone."""
        key = keys.artifact(ref.run_id, ref.name)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(key)
            pipe.strlen(key)
            exists, size = pipe.execute()
        return int(size) if exists else None

    def artifact_chunks(
        self, ref: ArtifactRef, size: int, *, chunk_bytes: int = 256 * 1024
    ) -> Iterator[bytes]:
        """The artifact's first `size` bytes, `chunk_bytes` per read (GETRANGE), so that a big
        one is never held whole. A copy that does not match its recorded sha256 is logged
        once the last chunk is out (it cannot be taken back from a reader by then)."""
        key = keys.artifact(ref.run_id, ref.name)
        digest = hashlib.sha256()
        for start in range(0, size, chunk_bytes):
            end = min(start + chunk_bytes, size) - 1
            chunk = bytes(
                self.redis.execute_command("GETRANGE", key, start, end, NEVER_DECODE=True)
            )
            digest.update(chunk)
            yield chunk
        if size == ref.size_bytes and digest.hexdigest() != ref.sha256:
            logger.error("artifact %s does not match its recorded sha256", ref.uri)

    # -- audit -------------------------------------------------------------------------------

    def audit(self, run_id: str, entries: Iterable[Mapping[str, Any]]) -> int:
        """Append entries to the run's audit stream; returns how many were written."""
        with self.redis.pipeline(transaction=False) as pipe:
            count = self.queue_audit(pipe, run_id, entries)
            if count:
                pipe.execute()
        return count

    def queue_audit(self, pipe: Any, run_id: str, entries: Iterable[Mapping[str, Any]]) -> int:
        """Queue entries for the run's audit stream on `pipe` (a transaction of the caller's, so
        that they are written with what they record); returns how many."""
        count = 0
        for entry in entries:
            pipe.xadd(keys.audit(run_id), {k: _audit_value(v) for k, v in entry.items()})
            count += 1
        return count

    def audit_tail(self, run_id: str, count: int = 200) -> list[dict[str, str]]:
        """The newest `count` audit entries, oldest first."""
        entries = self.redis.xrevrange(keys.audit(run_id), count=count)
        return [dict(fields, id=entry_id) for entry_id, fields in reversed(entries)]

    def audit_log(self, run_id: str) -> list[dict[str, str]]:
        return [
            dict(fields, id=entry_id) for entry_id, fields in self.redis.xrange(keys.audit(run_id))
        ]


def connect(config: RedisConfig | str) -> redis.Redis:
    """A client of `config` (over TLS as it says) that retries a command for about 20 s while
    Redis is away (a restart)."""
    if isinstance(config, str):
        config = RedisConfig(url=config)
    return redis.Redis.from_url(
        config.url,
        **config.client_options(),
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=12),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=30,
    )


def _arg(value: Any) -> str:
    """A command argument as the script passes it on (Redis receives every argument as a
    string)."""
    return value if isinstance(value, str) else str(value)


def _audit_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > MAX_AUDIT_ENTRY_CHARS:
        cut = len(text) - MAX_AUDIT_ENTRY_CHARS
        text = (
            text[:MAX_AUDIT_ENTRY_CHARS]
            + f"…[audit entry truncated: {cut} of {len(text)} chars cut]"
        )
    return text


def run_fields(run: RunRecord) -> dict[str, str]:
    """The fields of a run's hash, as the store writes them (a benchmark fills a store with
    them in bulk)."""
    fields = {
        "meta": json.dumps(
            {
                "id": run.id,
                "pipeline": run.pipeline,
                "pipeline_hash": run.pipeline_hash,
                "repo": run.repo,
                "commit": run.commit,
                "base": run.base,
                "idempotency_key": run.idempotency_key,
                "created_at": run.created_at,
                "environment_spec": run.environment_spec,
                "budget": run.budget.model_dump(exclude_none=True) if run.budget else None,
                "stage_order": list(run.stages),
            }
        ),
        "issue": run.issue.model_dump_json(),
        "status": run.status.value,
        "reason": run.reason or "",
        "current_stage": run.current_stage or "",
        "environment": run.environment or "",
        "updated_at": repr(run.updated_at),
    }
    for name, stage in run.stages.items():
        fields[keys.stage_field(name)] = stage.model_dump_json()
    for name, gate in run.gates.items():
        fields[keys.gate_field(name)] = gate.model_dump_json()
    return fields


def _parse_run(run_id: str, fields: Mapping[str, str]) -> RunRecord:
    if not fields:
        raise RunNotFoundError(run_id)
    meta = json.loads(fields["meta"])
    order = meta.pop("stage_order", [])
    stages = {
        name.removeprefix("stage:"): StageRecord.model_validate_json(value)
        for name, value in fields.items()
        if name.startswith("stage:")
    }
    stages = {name: stages[name] for name in sorted(stages, key=_position(order))}
    gates = {
        name.removeprefix("gate:"): GateRecord.model_validate_json(value)
        for name, value in fields.items()
        if name.startswith("gate:")
    }
    return RunRecord(
        **meta,
        issue=Issue.model_validate_json(fields["issue"]),
        status=RunStatus(fields["status"]),
        reason=fields.get("reason") or None,
        current_stage=fields.get("current_stage") or None,
        environment=fields.get("environment") or None,
        updated_at=float(fields["updated_at"]),
        stages=stages,
        gates=gates,
    )


def _position(order: list[str]) -> Callable[[str], tuple[int, str]]:
    """Sort key: pipeline order first, then any other stage by name."""
    return lambda name: (order.index(name) if name in order else len(order), name)
