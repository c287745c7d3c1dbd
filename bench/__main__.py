"""`python -m bench [isolation|overhead ...] [--json]`: run benchmarks, record their results.

With no names, all of them run, in the order of `BENCHMARKS` (what `make bench` does). Each
benchmark's figures go to bench/results/ (`bench.record`); then the docs' generated sections are
drawn afresh from them (`bench.docs`, what `make docs` does).

A benchmark whose code (its `CODE`) has uncommitted changes is not run: its figures would be
stamped with a commit that does not hold the code they measured. `--allow-dirty` runs it anyway,
and its results file records `<sha>-dirty`, which `python -m bench.stale` counts as stale.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import (
    anatomy,
    compaction,
    delegation,
    docs,
    environment,
    fanout,
    governor,
    graph,
    inspection,
    isolation,
    native,
    overhead,
    products,
    proofcost,
    record,
    sandbox,
    saturation,
    soak,
    throughput,
    upstream,
)

BENCHMARKS = {
    "isolation": isolation,
    "overhead": overhead,
    "sandbox": sandbox,
    "environment": environment,
    "native": native,
    "products": products,
    "governor": governor,
    "throughput": throughput,
    "saturation": saturation,
    "soak": soak,
    "inspection": inspection,
    "upstream": upstream,
    "compaction": compaction,
    "delegation": delegation,
    "fanout": fanout,
    "graph": graph,
    "anatomy": anatomy,
    "proofcost": proofcost,
}


def dirty_code(names: Sequence[str], root: Path = record.ROOT) -> dict[str, list[str]]:
    """Of the benchmarks `names`, each one whose `CODE` has uncommitted changes, and those
    files."""
    found = {name: record.dirty(BENCHMARKS[name].CODE, root) for name in names}
    return {name: files for name, files in found.items() if files}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="default: all")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run even when a benchmark's code has uncommitted changes (stamped <sha>-dirty)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    console = Console(stderr=True)
    names = args.names or list(BENCHMARKS)
    dirty = dirty_code(names)
    if dirty and not args.allow_dirty:
        files = sorted({f for found in dirty.values() for f in found})
        console.print(
            f"not recording {', '.join(dirty)}: their code has uncommitted changes "
            f"({', '.join(files)}); commit them first, or pass --allow-dirty to record "
            "figures stamped <sha>-dirty",
            markup=False,
        )
        return 2
    results: dict[str, Any] = {}
    written: set[str] = set()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        for name in names:
            module = BENCHMARKS[name]
            started = time.monotonic()
            results[name] = module.run(progress)
            results[name]["took_s"] = round(time.monotonic() - started)
            record.save(name, results[name], module.CODE)
            try:
                written.update(str(doc.relative_to(docs.ROOT)) for doc in docs.generate())
            except docs.DocsError as exc:  # the results are saved; the docs can be drawn later
                console.print(f"docs not drawn ({exc}); `make docs` draws them", markup=False)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        took = ", ".join(f"{name} {figures['took_s']} s" for name, figures in results.items())
        drawn = ", ".join(sorted(written)) or "no document changed"
        console.print(f"results written to bench/results/ ({took}); docs drawn afresh: {drawn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
