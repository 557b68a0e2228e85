#!/usr/bin/env python3
"""Reading run records: what one record costs the analysis, by the schema it was written in.

    .venv/bin/python benchmarks/record_read_bench.py [FOLDER ...] [--rounds 6] [--passes 20]

Every run record below each folder (a JSON object with a ``run_id`` and a ``schema_version``) (default: the kept CPU studies and record fixtures, the
kept H100 records) is read through ``scalerepro.record.read.read``, the one way the analysis reads
a record: the JSON parsed, taken up the upgrade chain to today's schema, validated and checked
for figures that disagree. Each round reads every record ``--passes`` times; prints the median
and the spread of the rounds in ms a record, for each schema version found, and the import of
the record model (pydantic builds its validators then), which every analysis command pays once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

DEFAULT_FOLDERS = (REPO / "tests/fixtures/studies", REPO / "tests/fixtures/records", REPO / "benchmarks/gpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, default=list(DEFAULT_FOLDERS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()

    # the import, in a fresh interpreter each time (this process has imported it once below)
    code = "import time; t = time.perf_counter(); import scalerepro.record.read; print(time.perf_counter() - t)"
    imports = [
        float(subprocess.run([sys.executable, "-c", code], cwd=REPO / "workflow", capture_output=True, text=True, check=True).stdout)
        for _ in range(args.rounds)
    ]
    print(
        f"import scalerepro.record.read: {1e3 * statistics.median(imports):.0f} ms (median of {args.rounds}; {1e3 * min(imports):.0f} to {1e3 * max(imports):.0f})"
    )

    from scalerepro.record.read import read

    by_schema: dict[int, list[Path]] = defaultdict(list)
    for folder in args.folders:
        for path in sorted(folder.rglob("*.json")):
            document = json.loads(path.read_text())
            if isinstance(document, dict) and "run_id" in document and isinstance(document.get("schema_version"), int):
                by_schema[document["schema_version"]].append(path)
    for version, paths in sorted(by_schema.items()):
        rounds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.passes):
                for path in paths:
                    read(path)
            rounds.append((time.perf_counter() - start) / (args.passes * len(paths)))
        print(
            f"schema {version}: {len(paths)} records, {1e3 * statistics.median(rounds):.3f} ms a record "
            f"(median of {args.rounds} rounds; {1e3 * min(rounds):.3f} to {1e3 * max(rounds):.3f})"
        )


if __name__ == "__main__":
    main()
