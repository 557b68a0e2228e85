"""The H100 frontier rows of benchmarks/README.md's current figures, generated from the kept records
of the latest GPU session (RECORDS) and config/references.yaml through the tables the report is
made from (runs.csv, published_comparison.csv of a records-only rebuild): one source, so the README
and the report cannot disagree. A test fails when the README differs from what this writes.

    python -m scalerepro.analysis.current_figures --write      # from the repository root

The analysis side: it never imports torch.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis import rebuild
from scalerepro.analysis.presentation.inputs import rows
from scalerepro.analysis.tables.published_comparison import BEST, NO_FIGURE
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import with_generated_part, write_text_atomically

RECORDS = Path("benchmarks/gpu/h100-2026-11-27")
README = Path("benchmarks/README.md")
FRONTIER_ROWS_MARKERS = (
    "<!-- the H100 frontier rows: generated from the kept records by `python -m scalerepro.analysis.current_figures --write` -->",
    "<!-- end of the generated H100 rows -->",
)
# the models in the README's order, each as the README names it
NAMES = {
    "resnet50": "ResNet-50",
    "resnet18_cifar": "ResNet-18 CIFAR",
    "gpt2_small": "GPT-2 124M",
    "bert_base": "BERT-base",
    "vit_b_16": "ViT-B/16",
    "llama_1b": "Llama-style 1B",
}
HEADER = "| what | figure | best published per GPU: ours ÷ it | machine | date |\n|---|---|---|---|---|"


def _tables(records: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs.csv and published_comparison.csv of ``records`` rebuilt as the report is (records only)."""
    with tempfile.TemporaryDirectory() as work, contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        out = Path(work) / "out"
        code = rebuild.main(["--records", str(records), "--out", str(out)])
        if code:
            raise CommandError(f"rebuilding {records} exited {code}")
        return pd.read_csv(out / "tables" / "runs.csv"), pd.read_csv(out / "tables" / "published_comparison.csv")


def _what(run: dict[str, Any]) -> str:
    shape = f"seq {run['seq_len']:.0f}" if run["seq_len"] is not None else f"{run['image_size']:.0f} px" if run["image_size"] is not None else ""
    return ", ".join(part for part in (NAMES[run["model"]], shape, f"batch {run['per_gpu_batch']:.0f}") if part)


def _figure(run: dict[str, Any], metric: str) -> str:
    """The record's throughput in the metric its published figures use, and its MFU."""
    mfu = f", MFU {100 * run['mfu']:.1f} %" if run["mfu"] is not None else ""
    if metric == "tokens_per_s_per_gpu":
        return f"**{run['tokens_per_s']:,.0f} tok/s**{mfu}"
    if run["seq_len"] is not None:
        return f"**{run['samples_per_s']:,.0f} seq/s** ({run['tokens_per_s']:,.0f} tok/s){mfu}"
    return f"**{run['samples_per_s']:,.0f} img/s**{mfu}"


def _best(best: dict[str, Any] | None) -> str:
    if best is None:
        return "none on this GPU part"
    gpus = int(best["published_gpus"])
    another = ", another model" if best["stand_in"] else ""
    return f"{best['published']:,.0f} (`{best['reference']}`, {gpus} GPU{'s' if gpus != 1 else ''}{another}): {best['ratio']:.2f}×"


def _machine(run: dict[str, Any]) -> str:
    power = f", {run['power_limit_w']:,.0f} W" if run["power_limit_w"] is not None else ""
    return f"one {run['device_name']} (driver {run['gpu_driver']}{power}), torch {run['torch_version']}"


def frontier_rows(records: Path = RECORDS) -> str:
    """The generated rows: one per model measured in ``records``, in NAMES' order."""
    runs, published = _tables(records)
    counted = {run["model"]: run for run in rows(runs[runs["counts"].astype(bool)])}
    figures = {(row["model"], row["role"]): row for row in rows(published)}
    lines = [HEADER]
    for model in (m for m in NAMES if m in counted):
        run = counted[model]
        best = figures.get((model, BEST))
        shown = best if best is not None else figures.get((model, NO_FIGURE))
        metric = str(shown["metric"]) if shown is not None else ""
        lines.append(f"| {_what(run)} | {_figure(run, metric)} | {_best(best)} | {_machine(run)} | {str(run['started_at'])[:10]} |")
    return "\n".join(lines) + "\n"


def readme_text(current: str, records: Path = RECORDS) -> str:
    """The README with its generated rows as written now (the prose around them kept)."""
    return with_generated_part(current, FRONTIER_ROWS_MARKERS, frontier_rows(records), README)


@error_boundary("scalerepro.analysis.current_figures")
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog="scalerepro.analysis.current_figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the rows into benchmarks/README.md (run from the repository root)")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(frontier_rows())
        return 0
    write_text_atomically(README, readme_text(README.read_text(encoding="utf-8")))
    print(f"wrote the H100 rows of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
