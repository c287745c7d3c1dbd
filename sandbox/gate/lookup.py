"""What the gate asks dockerd before it forwards a request: a container's id, labels and user,
and which container an exec runs in. Asked through docker-py, remembered by full id (a container's
labels and an exec's container never change)."""

from __future__ import annotations

import base64
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

import docker
import docker.errors

T = TypeVar("T")
REMEMBERED = 4096
"""How many containers and execs the gate remembers (the least recently used are forgotten)."""


@dataclass(frozen=True)
class Container:
    id: str
    labels: dict[str, str]
    user: str
    """Who its processes run as (`Config.User`), and an exec that names no user."""


class Lookup:
    """Inspections for the gate's checks, shared by its connections (one at a time)."""

    def __init__(self, docker_url: str) -> None:
        self._docker_url = docker_url
        self._api: docker.APIClient | None = None
        """Connected at the first lookup: the gate starts before dockerd answers, if need be."""
        self._lock = threading.Lock()
        self._containers: OrderedDict[str, Container] = OrderedDict()
        self._execs: OrderedDict[str, str] = OrderedDict()

    def container(self, ref: str) -> Container | None:
        """The container `ref` (an id, a short id or a name) names; None if there is none.

        Raises:
            docker.errors.DockerException, OSError: dockerd failed or cannot be reached.
        """
        with self._lock:
            found = self._remembered(self._containers, ref)
            if found is None:
                try:
                    info = self._client().inspect_container(ref)
                except docker.errors.NotFound:
                    return None
                config = info["Config"]
                found = Container(info["Id"], dict(config.get("Labels") or {}), config["User"])
                self._remember(self._containers, found.id, found)
            return found

    def exec_container(self, exec_id: str) -> str | None:
        """The id of the container exec `exec_id` runs in; None if there is no such exec."""
        with self._lock:
            found = self._remembered(self._execs, exec_id)
            if found is None:
                try:
                    info = self._client().exec_inspect(exec_id)
                except docker.errors.NotFound:
                    return None
                found = str(info["ContainerID"])
                self._remember(self._execs, str(info["ID"]), found)
            return found

    def is_link(self, container_id: str, path: str) -> bool:
        """Whether `path` in the container is a symbolic link (False when it does not exist),
        as dockerd's `HEAD /containers/{id}/archive` states it, without following it.

        Raises:
            docker.errors.DockerException, OSError: dockerd failed or cannot be reached.
        """
        with self._lock:
            api = self._client()
            url = f"{api.base_url}/v{api.api_version}/containers/{container_id}/archive"
            answer = api.head(url, params={"path": path})
        if answer.status_code == 404:
            return False
        answer.raise_for_status()
        stated = json.loads(base64.b64decode(answer.headers["X-Docker-Container-Path-Stat"]))
        return bool(stated.get("linkTarget"))

    def close(self) -> None:
        if self._api is not None:
            self._api.close()

    def _client(self) -> docker.APIClient:
        if self._api is None:
            self._api = docker.APIClient(base_url=self._docker_url, version="auto")
        return self._api

    @staticmethod
    def _remembered(memory: OrderedDict[str, T], key: str) -> T | None:
        found = memory.get(key)
        if found is not None:
            memory.move_to_end(key)
        return found

    @staticmethod
    def _remember(memory: OrderedDict[str, T], key: str, value: T) -> None:
        memory[key] = value  # by full id only: a name may name another container tomorrow
        while len(memory) > REMEMBERED:
            memory.popitem(last=False)
