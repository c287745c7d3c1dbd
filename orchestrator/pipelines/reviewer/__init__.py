"""The reviewer: a pull request in, review comments on it out.

summarise → inspect → test → review. `summarise` reads the pull request and its diff
(`{change}`) and says what changes; `inspect` reads the code around the change in a sandbox at
the head; `test` has Baton run the repository's tests there and reads what they say; `review`
writes comments (file, line, severity, text) and posts them as one GitHub review with its host
tool, `post_review`, which keeps each comment on a line of the pull request's diff or moves it
into the review's body, saying why.

Everything the pipeline is lives here: its spec (`SPEC`), its output schemas (`schemas`), its
host tool (`tools`) and the placing of comments on the diff (`diff`). docs/reviewer.md tells
it whole.
"""

from pathlib import Path

SPEC = Path(__file__).with_name("pipeline.toml")
"""The pipeline's spec; name the pipeline by this path (`baton enqueue --pipeline PATH`)."""
