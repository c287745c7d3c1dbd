"""Run inside a build container, by `sandbox.build`, after the setup: keep its build products.

    python3 -c "$(cat products.py)" /workspace UID GID < tracked-names

From the workspace goes every file the repository's tree holds (stdin: their paths, each ended
by a NUL), and every folder that held only those; each sandbox lays its run's own commit there.
What stays is what the setup made that git does not track: compiled modules, generated files,
`.egg-info`, the `node_modules` link. It is handed to the sandboxes' user (UID, GID), and its list
printed as JSON: a path per product, a folder that holds nothing tracked as one entry ending in
`/`. Standard library only: it runs on the image's own Python.
"""

from __future__ import annotations

import json
import os
import sys


def tracked_folders(tracked: set[str]) -> set[str]:
    """Every folder that holds a tracked file, at any depth."""
    folders: set[str] = set()
    for name in tracked:
        name = os.path.dirname(name)
        while name and name not in folders:
            folders.add(name)
            name = os.path.dirname(name)
    return folders


def keep_products(root: str, tracked: set[str]) -> list[str]:
    """Remove the tracked files under `root` (and the tracked folders left empty); the products
    left, sorted, folders holding nothing tracked as one entry ending in `/`."""
    folders = tracked_folders(tracked)
    for name in tracked:
        path = os.path.join(root, name)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
    for here, _dirs, _files in os.walk(root, topdown=False):
        name = os.path.relpath(here, root)
        if name in folders and not os.listdir(here):
            os.rmdir(here)
    products: list[str] = []

    def walk(folder: str) -> None:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            name = os.path.relpath(entry.path, root)
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and name in folders:
                walk(entry.path)
            else:
                products.append(name + "/" if is_dir else name)

    walk(root)
    return products


def hand_over(root: str, uid: int, gid: int) -> None:
    """Everything under `root` (not `root` itself) to `uid:gid`, links not followed."""
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(here, name), uid, gid)


def main(argv: list[str]) -> None:
    root, uid, gid = argv[0], int(argv[1]), int(argv[2])
    raw = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    products = keep_products(root, {name for name in raw.split("\0") if name})
    hand_over(root, uid, gid)
    print(json.dumps(products))


if __name__ == "__main__":
    main(sys.argv[1:])
