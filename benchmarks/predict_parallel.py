"""The 3D-parallel step (``scalerepro.analysis.tables.parallel_step``) against published series whose
layouts are stated, as ``predict_published.py`` back-tests DDP and FSDP: of a series' counts the
model is given the smallest, fits its one free term on the next ones and predicts the rest (held
back), each beside ideal scaling's error.

    .venv/bin/python benchmarks/predict_published.py --parallel-3d

It needs no torch: the series are figures read from their sources (named beside each row).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from scalerepro.analysis.tables import network_model, parallel_step  # noqa: E402
from scalerepro.common import gpu_peaks  # noqa: E402


def roles(counts: list[int]) -> dict[int, str]:
    """Each count's part in the back-test (module docstring): "given" (c_1), "fit" (c_2 .. c_j,
    j = ceil(k / 2), on a series of three or more) or "held back"."""
    ordered = sorted(counts)
    fit_until = math.ceil(len(ordered) / 2) if len(ordered) >= 3 else 1
    return {count: "given" if i == 0 else "fit" if i < fit_until else "held back" for i, count in enumerate(ordered)}


def _golden_minimum(function: Callable[[float], float], low: float, high: float, tolerance: float = 1e-5) -> float:
    """The minimum of a function with one minimum on [low, high], by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    while b - a > tolerance:
        if function(c) < function(d):
            b, d = d, c
            c = b - ratio * (b - a)
        else:
            a, c = c, d
            d = a + ratio * (b - a)
    return (a + b) / 2


# ---- the 3D-parallel back-test (--parallel-3d) -------------------------------------------------
# Published series whose layouts are stated: MLPerf Training's NVIDIA GPT-3 175B and Llama 3.1 405B
# result logs (tokens of each logged block over its duration, the median block of each result file,
# the median of the files; the global batch from the log's global_batch_size) and the layouts of
# their config_DGXH100_*.sh (TP, PP, INTERLEAVED_PIPELINE = VP, MICRO_BATCH_SIZE, CONTEXT_PARALLEL).
# Sources: mlcommons/training_results_v3.1 @ d06288b2bd675a9d88e0e6181f5bb5626b71ec19,
# v4.0 @ 6fe954378efe4a1a1bd665550b18ff8f26018def, v4.1 @ b87b9e396f771345d4ef122ba33456304f15228d,
# v5.0 @ 0fdc28f013256aea84fa36fdaf1e0fa46094b18c; the result directory of each row below.
GPT3_175B = parallel_step.Transformer(parameters=175_000_000_000, layers=96, hidden=12288, kv_hidden=12288)
# Llama 3.1 405B: 126 layers, hidden 16384, 8 KV heads of 128 (grouped-query attention)
LLAMA31_405B = parallel_step.Transformer(parameters=405_000_000_000, layers=126, hidden=16384, kv_hidden=1024)


@dataclass(frozen=True)
class ParallelRow:
    """One published count of a 3D series: its layout and tokens/s per GPU, and where it is."""

    layout: parallel_step.Layout
    value: float
    source: str


def _rows(seq: int, cp: int, *rows: tuple[int, int, int, int, int, int, float, str]) -> tuple[ParallelRow, ...]:
    """(GPUs, global batch, TP, PP, VP, micro-batch, tok/s/GPU, result directory) per row."""
    return tuple(ParallelRow(parallel_step.Layout(n, tp, pp, vp, mb, batch, seq, cp), value, where) for n, batch, tp, pp, vp, mb, value, where in rows)


PARALLEL_SERIES: tuple[tuple[str, parallel_step.Transformer, tuple[ParallelRow, ...]], ...] = (
    (
        "MLPerf v3.1 GPT-3 175B Eos",
        GPT3_175B,
        _rows(
            2048,
            1,
            (512, 2048, 4, 8, 12, 1, 739.9, "v3.1 NVIDIA/results/eos_n64_ngc23.09_nemo/gpt3"),
            (768, 3072, 4, 8, 12, 1, 738.5, "v3.1 NVIDIA/results/eos_n96_ngc23.09_nemo/gpt3"),
            (4096, 2048, 4, 8, 12, 1, 629.0, "v3.1 NVIDIA/results/eos-dfw_n512_ngc23.09_nemo/gpt3"),
            (6144, 3072, 4, 8, 12, 1, 625.8, "v3.1 NVIDIA/results/eos-dfw_n768_ngc23.09_nemo/gpt3"),
            (8192, 4096, 4, 8, 12, 1, 624.3, "v3.1 NVIDIA/results/eos-dfw_n1024_ngc23.09_nemo/gpt3"),
            (10240, 2560, 4, 8, 12, 1, 540.4, "v3.1 NVIDIA/results/eos-dfw_n1280_ngc23.09_nemo/gpt3"),
            (10752, 2688, 4, 8, 12, 1, 537.9, "v3.1 NVIDIA/results/eos-dfw_n1344_ngc23.09_nemo/gpt3"),
        ),
    ),
    (
        "MLPerf v4.0 GPT-3 175B Eos",
        GPT3_175B,
        _rows(
            2048,
            1,
            (512, 2304, 4, 8, 4, 2, 839.2, "v4.0 NVIDIA/results/eos_n64_ngc24.04_nemo/gpt3"),
            (10752, 2688, 4, 6, 8, 1, 556.1, "v4.0 NVIDIA/results/eos-dfw_n1344_ngc24.04_nemo/gpt3"),
            (11616, 2904, 4, 6, 8, 1, 555.6, "v4.0 NVIDIA/results/eos-dfw_n1452_ngc24.04_nemo/gpt3"),
        ),
    ),
    (
        "MLPerf v4.1 GPT-3 175B Eos",
        GPT3_175B,
        _rows(
            2048,
            1,
            (256, 2048, 4, 8, 6, 2, 890.1, "v4.1 NVIDIA/results/eos_n32_ngc24.09_nemo/gpt3"),
            (512, 2048, 4, 8, 6, 2, 858.6, "v4.1 NVIDIA/results/eos_n64_ngc24.09_nemo/gpt3"),
        ),
    ),
    # Oracle's rows are another system (OCI's BM.GPU.H100.8 nodes on their own fabric), a series of
    # their own: nothing of Eos is given to them. Its links are taken as the preset's: OCI's fabric is
    # not among the clusters of references.yaml, which the row says.
    (
        "MLPerf v4.1 GPT-3 175B Oracle (links assumed)",
        GPT3_175B,
        _rows(
            2048,
            1,
            (1536, 3072, 4, 8, 4, 2, 782.2, "v4.1 Oracle/results/1536xBM.GPU.H100.8/gpt3"),
            (3072, 3072, 4, 8, 4, 2, 616.8, "v4.1 Oracle/results/3072xBM.GPU.H100.8/gpt3 (blocks 609-730)"),
        ),
    ),
    (
        "MLPerf v5.0 Llama3.1 405B Eos",
        LLAMA31_405B,
        _rows(
            8192,
            2,
            (512, 1152, 8, 8, 8, 1, 333.9, "v5.0 NVIDIA/results/eos-dfw_n64_ngc25.01_nemo/llama31_405b"),
            (2048, 1152, 8, 8, 8, 1, 323.5, "v5.0 NVIDIA/results/eos-dfw_n256_ngc25.01_nemo/llama31_405b"),
            (2432, 1216, 8, 8, 8, 1, 321.4, "v5.0 NVIDIA/results/eos-dfw_n304_ngc25.01_nemo/llama31_405b"),
            (2560, 1120, 8, 8, 8, 1, 315.6, "v5.0 NVIDIA/results/eos-dfw_n320_ngc25.01_nemo/llama31_405b"),
            (8192, 1536, 8, 8, 8, 1, 292.5, "v5.0 NVIDIA/results/eos-dfw_n1024_ngc25.01_nemo/llama31_405b"),
        ),
    ),
)


def backtest_parallel(preset: network_model.ClusterPreset, hbm_bytes_per_s: float) -> list[dict]:
    """The 3D step (``parallel_step``) on each series as the DDP and FSDP back-test runs: the
    compute W fitted to the given (smallest) count, the data-parallel collectives' exposed share
    fitted on the fit counts (0 where none is fitted), the held-back counts predicted."""
    out = []
    for label, model, rows in PARALLEL_SERIES:
        role = roles([r.layout.gpus for r in rows])
        base = rows[0]
        base_step = base.layout.global_batch * base.layout.seq_len / (base.layout.gpus * base.value)

        def predicted(row: ParallelRow, share: float, model=model, base=base, base_step=base_step) -> tuple[float, parallel_step.ParallelStep]:
            w = parallel_step.fit_token_compute(model, base.layout, preset, base_step, hbm_bytes_per_s, share)
            step = parallel_step.simulate_parallel_step(model, row.layout, preset, w, hbm_bytes_per_s, share)
            return parallel_step.tokens_per_s_per_gpu(row.layout, step.step_s), step

        fit_rows = [r for r in rows if role[r.layout.gpus] == "fit"]
        share = 0.0
        if fit_rows:

            def misfit(candidate: float, fit_rows=fit_rows, predicted=predicted) -> float:
                return sum((predicted(r, candidate)[0] / r.value - 1) ** 2 for r in fit_rows)

            share = _golden_minimum(misfit, 0.0, 1.0)
        for row in rows:
            value, step = predicted(row, share)
            out.append(
                {
                    "source": label,
                    "gpus": row.layout.gpus,
                    "role": role[row.layout.gpus],
                    "layout": row.layout.describe(),
                    "published": row.value,
                    "predicted": value,
                    "error": value / row.value - 1,
                    "ideal_error": base.value / row.value - 1,
                    "share": share,
                    "step": step,
                    "where": row.source,
                }
            )
    return out


def megatron_layouts(preset: network_model.ClusterPreset, hbm_bytes_per_s: float, references: dict[str, dict]) -> list[str]:
    """Megatron-LM's GPT-3 175B strong scaling (global batch 1152 of 4096 tokens, 96 and 4608 GPUs):
    the source states no layout, so each layout that fits both counts (TP 8 within a node, PP a
    divisor of 96 layers, the global batch splitting into micro-batches of 1) is given the 96-GPU
    figure and predicts the 4608-GPU one, its data-parallel collectives hidden as the schedule
    hides them (share 0) and shown whole (share 1)."""
    small, large = references["megatron-gpt3-175b-h100-96"], references["megatron-gpt3-175b-h100-4608"]
    seq, batch = small["conditions"]["seq_len"], 1152
    lines = []
    for pp in (4, 6, 8, 12):
        for vp in (1, 2, 4):
            layouts = [parallel_step.Layout(n, 8, pp, vp, 1, batch, seq) for n in (small["gpus"], large["gpus"])]
            try:
                [layout.micro_batches for layout in layouts]
            except ValueError:
                continue
            if 96 % (pp * vp):
                continue
            cells = []
            for share in (0.0, 1.0):
                base_step = batch * seq / (small["gpus"] * small["value"])
                w = parallel_step.fit_token_compute(GPT3_175B, layouts[0], preset, base_step, hbm_bytes_per_s, share)
                step = parallel_step.simulate_parallel_step(GPT3_175B, layouts[1], preset, w, hbm_bytes_per_s, share)
                value = parallel_step.tokens_per_s_per_gpu(layouts[1], step.step_s)
                cells.append(f"share {share:g}: {value:,.0f} ({value / large['value'] - 1:+.1%})")
            lines.append(f"  {layouts[1].describe():<52} {'; '.join(cells)}")
    return lines


def print_parallel_backtest(presets, references: dict[str, dict]) -> None:
    """The 3D back-test's table (``backtest_parallel``) and Megatron-LM's layouts (``megatron_layouts``)."""
    preset = presets["dgx_h100"]
    tbps = gpu_peaks.PEAKS["h100_sxm"].hbm_tbps
    assert tbps is not None  # the H100 SXM's HBM peak is in the table
    hbm = tbps * 1e12
    rows = backtest_parallel(preset, hbm)
    print("\n3D-parallel back-test (parallel_step): MLPerf Training result logs, tok/s per GPU")
    print(
        f"{'series':<34} {'GPUs':>6} {'role':>9} {'published':>9} {'predicted':>9} {'pred/pub-1':>10} {'ideal/pub-1':>11}  layout; bubble, DP exposed of total, ms"
    )
    for r in rows:
        s = r["step"]
        error = "(given)" if r["role"] == "given" else f"{r['error']:+.1%}"
        ideal = "" if r["role"] == "given" else f"{r['ideal_error']:+.1%}"
        print(
            f"{r['source']:<34} {r['gpus']:>6} {r['role']:>9} {r['published']:>9.1f} {r['predicted']:>9.1f} {error:>10} {ideal:>11}  "
            f"{r['layout']}; {s.bubble_s * 1e3:.0f}, {s.dp_exposed_s * 1e3:.0f} of {s.dp_total_s * 1e3:.0f} of step {s.step_s * 1e3:.0f}"
        )
    print("\nper series: median |e| over held-back rows, model beside ideal scaling; the published fall across the series")
    for label, _, series_rows in PARALLEL_SERIES:
        mine = [r for r in rows if r["source"] == label]
        held = [r for r in mine if r["role"] == "held back"]
        fall = 1 - min(r.value for r in series_rows) / series_rows[0].value
        print(
            f"  {label:<34} held back {', '.join(str(r['gpus']) for r in held)}: model {_median_abs([r['error'] for r in held]):.1%}, "
            f"ideal {_median_abs([r['ideal_error'] for r in held]):.1%}; fall {fall:.1%}; DP exposed share {mine[0]['share']:.2f} "
            f"({'fitted on ' + ', '.join(str(r['gpus']) for r in mine if r['role'] == 'fit') if any(r['role'] == 'fit' for r in mine) else 'nothing fitted'})"
        )
    print_weak_backtest(presets)
    print("\nMegatron-LM GPT-3 175B, 96 -> 4608 GPUs, global batch 1152 (no layout stated): the 4608-GPU prediction per layout")
    for line in megatron_layouts(preset, hbm, references):
        print(line)


def _median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values)


# ---- Narayanan et al.'s Table 1: weak scaling, one model a row ----------------------------------
# "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC21), Table 1:
# GPT models of 1.7B to 1T parameters on up to 3,072 A100 80GB GPUs (Selene, DGX A100 nodes), fp16,
# sequence 2,048, vocabulary 51,200, full activation recomputation. Its achieved teraFLOP/s per GPU
# as NVIDIA/Megatron-LM's README showed the table (images/cases_april2021.png at commit
# 937571cfd4^); each row's layout from examples/academic_paper_scripts/sc21/run_table_1.sh at
# d98e8a64: TP, PP, micro-batch, global batch, layers, hidden, heads, the DDP implementation, and VP
# = layers / (PP x --num-layers-per-virtual-pipeline-stage). Sequence parallelism and TP overlap
# came later (2022): neither is on.
TABLE_1_VOCAB = 51_200
TABLE_1_SEQ = 2048


@dataclass(frozen=True)
class WeakRow:
    """One row of a weak-scaling series: its own model and layout, the published TFLOP/s per GPU."""

    label: str
    model: parallel_step.Transformer
    layout: parallel_step.Layout
    tflops: float

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """The published figure in tokens: TFLOP/s over the source's own FLOPs of a token."""
        return self.tflops * 1e12 / parallel_step.matmul_flops_per_token(self.model, self.layout.seq_len, self.layout.recompute)


def _table_1(*rows: tuple[str, float, int, int, int, int, int, int, int, int, int, str, float]) -> tuple[WeakRow, ...]:
    """(label, parameters in billions, layers, hidden, heads, GPUs, TP, PP, VP, micro-batch, global batch, DDP, TFLOP/s)."""
    schedule: dict[str, parallel_step.DpSchedule] = {"torch": "overlapped", "local": "after_backward"}
    return tuple(
        WeakRow(
            label,
            parallel_step.Transformer(parameters=round(billions * 1e9), layers=layers, hidden=hidden, kv_hidden=hidden, heads=heads, vocab=TABLE_1_VOCAB),
            parallel_step.Layout(
                gpus, tp, pp, vp, micro, batch, TABLE_1_SEQ, sequence_parallel=False, tp_overlap=False, recompute=True, dp_schedule=schedule[ddp]
            ),
            tflops,
        )
        for label, billions, layers, hidden, heads, gpus, tp, pp, vp, micro, batch, ddp, tflops in rows
    )


TABLE_1 = _table_1(
    ("1.7B", 1.7, 24, 2304, 24, 32, 1, 1, 1, 16, 512, "torch", 137),
    ("3.6B", 3.6, 30, 3072, 32, 64, 2, 1, 1, 16, 512, "torch", 138),
    ("7.5B", 7.5, 36, 4096, 32, 128, 4, 1, 1, 16, 512, "torch", 142),
    ("18B", 18.4, 40, 6144, 48, 256, 8, 1, 1, 8, 1024, "torch", 135),
    ("39B", 39.1, 48, 8192, 64, 512, 8, 2, 1, 4, 1536, "local", 138),
    ("76B", 76.1, 60, 10240, 80, 1024, 8, 4, 3, 2, 1792, "local", 140),
    ("145B", 145.6, 80, 12288, 96, 1536, 8, 8, 2, 2, 2304, "local", 148),
    ("310B", 310.1, 96, 16384, 128, 1920, 8, 16, 2, 1, 2160, "local", 155),
    ("530B", 529.6, 105, 20480, 128, 2520, 8, 35, 3, 1, 2520, "local", 163),
    ("1T", 1008.0, 128, 25600, 160, 3072, 8, 64, 1, 1, 3072, "local", 163),
)


def backtest_weak(rows: tuple[WeakRow, ...], preset: network_model.ClusterPreset, hbm_bytes_per_s: float) -> list[dict]:
    """The 3D step on a weak-scaling series: the matmul rate R fitted to the given row, kappa (the
    memory traffic per activation byte, ``parallel_step.token_compute_s``) fitted on the fit rows,
    the held-back rows predicted; ideal scaling holds the given row's TFLOP/s per GPU."""
    role = roles([r.layout.gpus for r in rows])
    base = rows[0]
    base_step = base.layout.global_batch * base.layout.seq_len / (base.layout.gpus * base.tokens_per_s_per_gpu)
    w_base = parallel_step.fit_token_compute(base.model, base.layout, preset, base_step, hbm_bytes_per_s)
    per_kappa = parallel_step.token_compute_s(base.model, base.layout, parallel_step.ComputeRate(math.inf, 1.0, hbm_bytes_per_s))
    kappa_max = w_base / per_kappa  # beyond it the traffic alone outlasts the given row's compute

    def predicted(row: WeakRow, kappa: float) -> tuple[float, parallel_step.ParallelStep]:
        rate = parallel_step.fit_matmul_rate(base.model, base.layout, preset, base_step, kappa, hbm_bytes_per_s)
        step = parallel_step.simulate_parallel_step(row.model, row.layout, preset, parallel_step.token_compute_s(row.model, row.layout, rate), hbm_bytes_per_s)
        tokens = parallel_step.tokens_per_s_per_gpu(row.layout, step.step_s)
        return tokens * parallel_step.matmul_flops_per_token(row.model, row.layout.seq_len, row.layout.recompute) / 1e12, step

    fit_rows = [r for r in rows if role[r.layout.gpus] == "fit"]
    kappa = _golden_minimum(lambda k: sum((predicted(r, k)[0] / r.tflops - 1) ** 2 for r in fit_rows), 0.0, 0.999 * kappa_max)
    rate = parallel_step.fit_matmul_rate(base.model, base.layout, preset, base_step, kappa, hbm_bytes_per_s)
    out = []
    for row in rows:
        value, step = predicted(row, kappa)
        out.append(
            {
                "label": row.label,
                "gpus": row.layout.gpus,
                "role": role[row.layout.gpus],
                "layout": row.layout.describe(),
                "published": row.tflops,
                "predicted": value,
                "error": value / row.tflops - 1,
                "ideal_error": base.tflops / row.tflops - 1,
                "kappa": kappa,
                "matmul_tflops": rate.matmul_flops_per_s / 1e12,
                "step": step,
            }
        )
    return out


def print_weak_backtest(presets: dict[str, network_model.ClusterPreset]) -> None:
    """``backtest_weak`` on Table 1, on the DGX A100 preset and the A100 80GB's HBM."""
    tbps = gpu_peaks.PEAKS["a100_sxm_80gb"].hbm_tbps
    assert tbps is not None  # the A100 80GB's HBM peak is in the table
    rows = backtest_weak(TABLE_1, presets["dgx_a100"], tbps * 1e12)
    print("\nNarayanan et al. SC21 Table 1 (A100 80GB, DGX A100; weak scaling, one model a row): TFLOP/s per GPU")
    print(
        f"{'model':>6} {'GPUs':>6} {'role':>9} {'published':>9} {'predicted':>9} {'pred/pub-1':>10} {'ideal/pub-1':>11}  layout; bubble, TP, DP exposed, step ms"
    )
    for r in rows:
        s = r["step"]
        error = "(given)" if r["role"] == "given" else f"{r['error']:+.1%}"
        ideal = "" if r["role"] == "given" else f"{r['ideal_error']:+.1%}"
        print(
            f"{r['label']:>6} {r['gpus']:>6} {r['role']:>9} {r['published']:>9.0f} {r['predicted']:>9.1f} {error:>10} {ideal:>11}  "
            f"{r['layout']}; {s.bubble_s * 1e3:.0f}, {s.tp_exposed_s * 1e3:.0f}, {s.dp_exposed_s * 1e3:.0f}, {s.step_s * 1e3:.0f}"
        )
    held = [r for r in rows if r["role"] == "held back"]
    print(
        f"  held back {', '.join(r['label'] for r in held)}: model median |e| {_median_abs([r['error'] for r in held]):.1%}, largest "
        f"{max(abs(r['error']) for r in held):.1%}; ideal {_median_abs([r['ideal_error'] for r in held]):.1%}, largest "
        f"{max(abs(r['ideal_error']) for r in held):.1%}; kappa {rows[0]['kappa']:.2f} (fitted on "
        f"{', '.join(r['label'] for r in rows if r['role'] == 'fit')}), matmul rate {rows[0]['matmul_tflops']:.0f} TFLOP/s"
    )
