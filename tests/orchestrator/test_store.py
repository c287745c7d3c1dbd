from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.core import keys
from orchestrator.core.errors import RunNotFoundError
from orchestrator.core.models import Issue, IssueSource, RunRecord, StageRecord
from orchestrator.core.store import MAX_AUDIT_ENTRY_CHARS, RunStore


def make_run(run_id: str = "r1") -> RunRecord:
    issue = Issue(source=IssueSource.TEXT, title="t")
    return RunRecord(
        id=run_id,
        pipeline="fixer",
        repo="/r",
        commit="c",
        issue=issue,
        idempotency_key=f"k-{run_id}",
        stages={"a": StageRecord(), "b": StageRecord()},
    )


def test_a_run_reads_back_as_written(store: RunStore) -> None:
    run, created = store.create(make_run())
    assert created
    assert store.get("r1") == run


def test_unknown_run_is_a_clear_error(store: RunStore) -> None:
    with pytest.raises(RunNotFoundError, match="no run with id 'nope'"):
        store.get("nope")


def test_runs_read_in_batches_come_back_in_order_with_none_for_a_missing_one(
    store: RunStore,
) -> None:
    made = {f"r{n}": store.create(make_run(f"r{n}"))[0] for n in range(5)}
    wanted = ["r3", "gone", "r0", "r4", "r1", "r2"]

    got = list(store.get_each(wanted, batch=2))

    assert [run_id for run_id, _ in got] == wanted
    assert dict(got) == {**made, "gone": None}


def test_concurrent_stage_updates_are_never_lost(store: RunStore) -> None:
    store.create(make_run())

    def bump(stage: str) -> None:
        for _ in range(25):
            store.transact(
                "r1",
                lambda run, _pipe: setattr(
                    run.stages[stage], "requests", run.stages[stage].requests + 1
                ),
            )

    threads = [threading.Thread(target=bump, args=(s,)) for s in ("a", "a", "b", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    stages = store.get("r1").stages
    assert (stages["a"].requests, stages["b"].requests) == (50, 50)


def test_a_write_that_lost_a_race_is_redone_with_its_commands_written_once(
    store: RunStore,
) -> None:
    store.create(make_run())
    attempts: list[int] = []

    def mutate(run: RunRecord, pipe: Any) -> None:
        attempts.append(run.stages["a"].requests)
        if len(attempts) == 1:  # another writer gets in between this read and its write
            store.transact("r1", lambda other, _pipe: setattr(other.stages["b"], "requests", 7))
        run.stages["a"].requests += 1
        run.stages["a"].error = "naïve ✓"
        pipe.xadd("r1:log", {"attempt": len(attempts)})

    store.transact("r1", mutate)

    stages = store.get("r1").stages
    assert attempts == [0, 0]
    assert (stages["a"].requests, stages["a"].error, stages["b"].requests) == (1, "naïve ✓", 7)
    assert [fields for _id, fields in store.redis.xrange("r1:log")] == [{"attempt": "2"}]


def test_a_run_removed_under_a_write_is_a_clear_error(store: RunStore) -> None:
    store.create(make_run())

    def mutate(run: RunRecord, pipe: Any) -> None:
        store.redis.delete(keys.run("r1"))
        run.stages["a"].requests += 1

    with pytest.raises(RunNotFoundError, match="r1"):
        store.transact("r1", mutate)
    assert not store.redis.exists(keys.run("r1"))


def test_artifacts_round_trip_as_bytes_with_their_digest(store: RunStore) -> None:
    store.create(make_run())
    data = b"diff --git a/x b/x\n\xff\x00binary-safe\n"
    ref = store.put_artifact("r1", "fix/workspace.diff", data, "text/x-diff")

    assert ref.uri == "artifact://r1/fix/workspace.diff"
    assert (ref.size_bytes, ref.media_type) == (len(data), "text/x-diff")
    assert store.artifact(ref) == data


def test_audit_entries_are_appended_in_order_and_huge_ones_cut(store: RunStore) -> None:
    store.audit(
        "r1",
        [{"kind": "a", "data": "x"}, {"kind": "b", "data": "y" * (MAX_AUDIT_ENTRY_CHARS + 500)}],
    )
    store.audit("r1", [{"kind": "c", "data": {"n": 1}}])

    log = store.audit_log("r1")
    assert [e["kind"] for e in log] == ["a", "b", "c"]
    assert log[1]["data"].endswith(
        f"[audit entry truncated: 500 of {MAX_AUDIT_ENTRY_CHARS + 500} chars cut]"
    )
    assert log[2]["data"] == '{"n": 1}'
