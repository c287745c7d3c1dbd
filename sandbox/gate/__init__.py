"""The sandbox gate: a Docker API proxy that lets a worker do what Baton's sandboxes need and
nothing else, so that workers never hold dockerd's own socket (whoever can write that is root
on the host).

    baton sandbox-gate --listen /run/baton-gate/docker.sock --docker unix:///var/run/docker.sock
    DOCKER_HOST=unix:///run/baton-gate/docker.sock baton worker ...

docker-py talks to the gate exactly as to dockerd. The gate forwards a request only when
`routes.route` has a route for it, and then only when its checks pass: a container it acts on
carries `baton.sandbox=1` (and is a build container only through the build socket,
`policy.py`), a container it creates is hardened as `sandbox.docker` and `sandbox.build` harden
theirs (`rules.py`), an exec belongs to such a container. A body is read as dockerd will read
it (`decode.py`, `schema.py`) and forwarded as the gate rebuilt it, never as sent. Everything
else is answered `403 {"message": "..."}` naming the request and the reason, which docker-py
raises as an `APIError`; each refusal is logged on one line (method, path, reason), never a
body or an environment value. docs/gate.md says what it allows and why.
"""

from __future__ import annotations

from sandbox.gate.policy import GatePolicy
from sandbox.gate.server import serve

__all__ = ["GatePolicy", "serve"]
