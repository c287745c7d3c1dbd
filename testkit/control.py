"""The control endpoints every fake model server of the testkit serves (`/_fake/…`): its
health, the record of what it was asked, a reset, and faults and the scenario replaced while it
runs. A fake subclasses `FakeControl`, naming its scenario's and its fault rules' types; what
else it keeps (a quota, a cache) it resets in `_reset_more` and takes from a new scenario in
`_adopt`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from testkit.gemini.faults import FaultBook, Selecting
from testkit.gemini.ledger import Ledger


class _Scenario(Protocol):
    @property
    def agents(self) -> Mapping[str, Any]: ...
    @property
    def faults(self) -> Sequence[Any]: ...


S = TypeVar("S", bound=BaseModel)
F = TypeVar("F", bound=Selecting)


class FakeControl(Generic[S, F]):
    """`/_fake/health`, `/_fake/requests`, `/_fake/reset`, `/_fake/faults` and `/_fake/scenario`
    over the server's `_scenario`, `_faults` and `_ledger`."""

    _scenario_type: type[S]
    _fault_rules: TypeAdapter[list[F]]
    _scenario: S
    _faults: FaultBook[F]
    _ledger: Ledger

    def control_routes(self) -> list[Route]:
        return [
            Route("/_fake/health", self.health, methods=["GET"]),
            Route("/_fake/requests", self.requests, methods=["GET"]),
            Route("/_fake/reset", self.reset, methods=["POST"]),
            Route("/_fake/faults", self.set_faults, methods=["PUT"]),
            Route("/_fake/scenario", self.set_scenario, methods=["PUT"]),
        ]

    def _reset_more(self) -> None:
        """Reset what else the server keeps besides its record and fault counters."""

    def _adopt(self, scenario: S) -> None:
        """Take what else the server keeps from a new scenario (its faults are taken already)."""

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def requests(self, request: Request) -> Response:
        return JSONResponse(self._ledger.entries())

    async def reset(self, request: Request) -> Response:
        self._ledger.clear()
        self._faults.reset()
        self._reset_more()
        return JSONResponse({"status": "ok"})

    async def set_faults(self, request: Request) -> Response:
        try:
            rules = self._fault_rules.validate_json(await request.body())
        except ValidationError as exc:
            return Response(exc.json(include_url=False), 422, media_type="application/json")
        self._faults.replace(rules)
        return JSONResponse({"status": "ok", "faults": len(rules)})

    async def set_scenario(self, request: Request) -> Response:
        try:
            scenario = self._scenario_type.model_validate_json(await request.body())
        except ValidationError as exc:
            return Response(exc.json(include_url=False), 422, media_type="application/json")
        self._scenario = scenario
        said: _Scenario = scenario  # type: ignore[assignment]
        self._faults.replace(said.faults)
        self._adopt(scenario)
        return JSONResponse({"status": "ok", "agents": sorted(said.agents)})
