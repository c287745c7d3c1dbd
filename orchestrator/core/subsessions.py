"""Child sessions of a stage: their derived ids, their composed branch labels, their depth.

A child agent (`workers.delegate`) runs in a session of its own, whose id is derived from its
parent's: `<parent>:sub:<branch>:<invocation>`, where `<branch>` is the child's own name and
`<invocation>` counts the delegations of the parent session, from 1. Each invocation is a
separate session (a separate row of the audit log), so two requests to the same child never
see each other's history. A background child addressed by a stable name gets the same id every
time instead, with no invocation suffix: `<parent>:sub:<name>`, where its parent is the run
(`Lineage.kept`): it outlives the stage that first addressed it, and every stage of the run
reaches it under the same id (`orchestrator.core.children`).

Every event a child's session stores carries a hierarchical branch label, the parent's label
and the child's name joined by ADK's "." separator (`fixer-plus.search.sub_cart`), stamped by
the session service of the child's runner (`workers.subsessions.LabellingSessionService`): an
event that already carries the label or one below it (a nested child's) keeps it, one with a
label relative to the child (ADK's own sub-branches) gets the child's label in front.

Depth is counted through the call chain (`Lineage`): a stage's agent is at depth 0, its
children at 1, theirs at 2; a lineage refuses to go past its `max_depth`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEPARATOR = "."
"""ADK's branch separator (`InvocationContext.branch`, `agent_1.agent_2.agent_3`)."""
SUB = "sub"
"""The marker between a parent's session id and its child's part."""
MAX_NAME_CHARS = 32
_NAME = re.compile(rf"^[a-z_][a-z0-9_]{{0,{MAX_NAME_CHARS - 1}}}$")
MAX_GIVEN_CHARS = MAX_NAME_CHARS - len(SUB) - 1
"""The longest name a model may give a child: its branch is `sub_<name>`."""
_GIVEN = re.compile(rf"^[a-z0-9_]{{1,{MAX_GIVEN_CHARS}}}$")


class DepthError(ValueError):
    """Raised when a delegation would start a child deeper than the lineage allows."""


def check_name(name: str) -> str:
    """`name` if it can be a child's branch segment: lower-case letters, digits and `_`,
    starting with a letter or `_` (so never `.` or `:`, the separators), at most 32 chars.

    Raises:
        ValueError: it cannot; the message says what a name may hold.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"a child's name is lower-case letters, digits and _, starting with a letter "
            f"(at most {MAX_NAME_CHARS} characters); {name[:40]!r} is not"
        )
    return name


def child_branch(given: str) -> str:
    """The branch name of a child the delegating model named `given`: `sub_<given>`, or `sub`
    for a child it did not name.

    Raises:
        ValueError: `given` cannot be part of a label or an id; the message quotes it and says
            what a name may hold (the model reads it as the tool's error).
    """
    if not given:
        return SUB
    if not _GIVEN.fullmatch(given):
        raise ValueError(
            f"a helper's name is lower-case letters, digits and _ (no '.', ':' or spaces), at "
            f"most {MAX_GIVEN_CHARS} characters; {given[:40]!r} is not"
        )
    return f"{SUB}_{given}"


def child_session_id(parent: str, branch: str, invocation: int) -> str:
    """The session id of the `invocation`-th delegation (from 1) of session `parent` to the
    child `branch`."""
    if invocation < 1:
        raise ValueError(f"an invocation counts from 1, not {invocation}")
    return f"{parent}:{SUB}:{check_name(branch)}:{invocation}"


def stable_session_id(parent: str, name: str) -> str:
    """The session id of the background child `name` of `parent`: the same each time it is
    addressed, so later work reaches the same session."""
    return f"{parent}:{SUB}:{check_name(name)}"


def child_label(parent: str, name: str) -> str:
    """The branch label of the child `name` of the agent labelled `parent`."""
    return f"{parent}{SEPARATOR}{check_name(name)}"


def stamped(label: str, existing: str | None) -> str:
    """The label an event of the child labelled `label` is stored with, given the one it has:
    its own or a nested child's is kept, none becomes `label`, a relative one goes below it."""
    if not existing:
        return label
    if existing == label or existing.startswith(label + SEPARATOR):
        return existing
    return f"{label}{SEPARATOR}{existing}"


@dataclass(frozen=True)
class Lineage:
    """Where an agent sits in a stage's delegation tree."""

    session: str
    """Its session id: the stage's (`<run>:<stage>:<attempt>`) or a derived one."""
    label: str
    """Its branch label: the stage's (`<pipeline>.<stage>`) or a composed one."""
    depth: int
    max_depth: int

    def child(self, name: str, invocation: int) -> Lineage:
        """The lineage of this agent's `invocation`-th child, named `name`.

        Raises:
            DepthError: the child would be deeper than `max_depth`.
            ValueError: `name` cannot be a child's name.
        """
        self._check_depth()
        return Lineage(
            session=child_session_id(self.session, name, invocation),
            label=child_label(self.label, name),
            depth=self.depth + 1,
            max_depth=self.max_depth,
        )

    def kept(self, name: str, run_id: str) -> Lineage:
        """The lineage of the kept child `name` as this agent addresses it: its session id is
        the run's (`<run>:sub:<name>`, the same from every stage), its label and depth are
        below this agent's, as any child's.

        Raises:
            DepthError: the child would be deeper than `max_depth`.
            ValueError: `name` cannot be a child's name.
        """
        self._check_depth()
        return Lineage(
            session=stable_session_id(run_id, name),
            label=child_label(self.label, name),
            depth=self.depth + 1,
            max_depth=self.max_depth,
        )

    def _check_depth(self) -> None:
        if self.depth + 1 > self.max_depth:
            raise DepthError(
                f"delegation is limited to depth {self.max_depth} and this agent is at depth "
                f"{self.depth}: do the work yourself instead of delegating"
            )


def stage_session(session: str) -> str:
    """The id of the stage session that `session` (its own, or a child's at any depth) belongs
    to: `<run>:<stage>:<attempt>`."""
    return session.split(f":{SUB}:", 1)[0]
