"""The study's figures, named once: ``scalerepro.analysis.presentation.plots`` draws a function of each name,
the workflow declares ``results/plots/<name>.{png,svg}`` for each (workflow/rules/analysis.smk)
and the report embeds each (report.py). Adding a figure: its drawing function in plots.py (or a module plots.py takes it from), its
name here, and the template line that shows it (tests/test_report.py checks all three agree).

Nothing heavy is imported here: the workflow reads this list when it parses, where matplotlib
and pandas need not be installed.
"""

FIGURE_NAMES = (
    "throughput_vs_gpus",
    "efficiency_vs_gpus",
    "loss_waterfall",
    "weak_epoch_time",
    "sensitivity_heatmap",
    "ablation_gain",
    "loss_curves",
    "accuracy_curves",
    "energy_per_sample",
    "busbw_vs_size",
    "profile_breakdown",
    "roofline",
    "predicted_vs_measured_efficiency",
)
