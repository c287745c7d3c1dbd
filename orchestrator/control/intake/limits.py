"""Size limits on what intake lets into a run, and the one function that applies them.

Strings over their limit are cut, with a visible marker saying how much was cut; the frame,
tag and link lists are capped. Only the payload size cap refuses: it is checked before any
parsing, by `parse_payload`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.models import Frame, Issue


class IntakeLimits(BaseModel):
    """How much of a payload intake keeps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_payload_bytes: int = Field(default=2_000_000, gt=0)
    """A larger payload (UTF-8 bytes) is refused with `PayloadTooLargeError`, before parsing."""
    max_frames: int = Field(default=40, gt=0)
    """Stack frames kept: in-app frames first, then the library frames nearest the raise."""
    max_title_chars: int = Field(default=300, gt=0)
    """Cap on the title, the error type and the culprit."""
    max_message_chars: int = Field(default=2_000, gt=0)
    """Cap on the error message."""
    max_body_chars: int = Field(default=8_000, gt=0)
    """Cap on the body (issue description, log message, earlier exceptions of a chain)."""
    max_context_line_chars: int = Field(default=300, gt=0)
    """Cap on each frame's source line, file and function."""
    max_tags: int = Field(default=40, ge=0)
    """Tags kept, in the order the source gave them; the rest are dropped."""
    max_tag_chars: int = Field(default=200, gt=0)
    """Cap on each tag key and value, and on the source id, level and platform."""
    max_links: int = Field(default=20, ge=0)
    """Links kept, in order, after duplicates are dropped."""
    max_link_chars: int = Field(default=2_000, gt=0)
    """A longer link is dropped rather than cut, since a cut URL points somewhere else."""


def cut(text: str, max_chars: int) -> str:
    """The first `max_chars` characters of `text`, then `…[cut N chars]` if any were cut."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}…[cut {len(text) - max_chars} chars]"


def cut_optional(text: str | None, max_chars: int) -> str | None:
    return None if text is None else cut(text, max_chars)


def cap_frames(frames: list[Frame], max_frames: int) -> list[Frame]:
    """At most `max_frames` frames, in their original order.

    In-app frames are kept first (those nearest the raise, if even they are too many); the
    remaining slots go to the library frames nearest the raise, which is the last frame.
    """
    if len(frames) <= max_frames:
        return frames
    in_app = [index for index, frame in enumerate(frames) if frame.in_app]
    library = [index for index, frame in enumerate(frames) if not frame.in_app]
    if len(in_app) >= max_frames:
        kept = in_app[-max_frames:]
    else:
        kept = in_app + library[len(library) - (max_frames - len(in_app)) :]
    return [frames[index] for index in sorted(kept)]


def apply_limits(issue: Issue, limits: IntakeLimits) -> Issue:
    """`issue` with every string cut to its limit and its lists capped."""
    line_chars = limits.max_context_line_chars
    frames = [
        frame.model_copy(
            update={
                "file": cut(frame.file, line_chars),
                "function": cut_optional(frame.function, line_chars),
                "context_line": cut_optional(frame.context_line, line_chars),
            }
        )
        for frame in cap_frames(issue.frames, limits.max_frames)
    ]
    tag_chars = limits.max_tag_chars
    tags = {
        cut(key, tag_chars): cut(value, tag_chars)
        for key, value in list(issue.tags.items())[: limits.max_tags]
    }
    links = [link for link in dict.fromkeys(issue.links) if len(link) <= limits.max_link_chars]
    return issue.model_copy(
        update={
            "source_id": cut_optional(issue.source_id, tag_chars),
            "title": cut(issue.title, limits.max_title_chars),
            "error_type": cut_optional(issue.error_type, limits.max_title_chars),
            "error_message": cut_optional(issue.error_message, limits.max_message_chars),
            "frames": frames,
            "culprit": cut_optional(issue.culprit, limits.max_title_chars),
            "level": cut_optional(issue.level, tag_chars),
            "platform": cut_optional(issue.platform, tag_chars),
            "tags": tags,
            "links": links[: limits.max_links],
            "body": cut_optional(issue.body, limits.max_body_chars),
        }
    )
