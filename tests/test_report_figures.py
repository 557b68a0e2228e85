"""The report's one lists: section numbers come from report.SECTIONS, and every figure is drawn,
listed, declared by the workflow and shown by a template."""

from __future__ import annotations

import re

from scalerepro.analysis.presentation import report

from report_study import REPO

TEMPLATE_FILES = sorted((REPO / "report" / "templates").rglob("*.j2"))


def test_section_numbers_come_from_the_one_list():
    """No template types a section number; each section of report.SECTIONS is numbered once, in order."""
    text = {path.name: path.read_text() for path in TEMPLATE_FILES}
    typed = {name: re.findall(r'class="secno">\s*[0-9]', page) for name, page in text.items()}
    assert not any(typed.values()), f"hand-typed section numbers: {typed}"
    used = re.findall(r'secno\["([a-z0-9-]+)"\]', "".join(text.values()))
    numbers = report.section_numbers()
    assert sorted(used) == sorted(numbers), "every listed section shows its number once, and only listed ones"
    headed = re.findall(r'secno\["([a-z0-9-]+)"\] \}\}</span> \{\{ sectitle\["([a-z0-9-]+)"\] \}\}</h[23]>', "".join(text.values()))
    assert sorted(a for a, _ in headed) == sorted(used) and all(a == b for a, b in headed), "a heading's title is typed"
    assert numbers["results"] == "4" and numbers["parallelism"] == "4.5" and numbers["profiling"] == "4.11"
    assert numbers["history-cells"] == "9.2"
    for anchor, _, _ in report.SECTIONS:  # each top-level section is its own template
        assert f"sections/{anchor}.html.j2" in {f"sections/{p.name}" for p in TEMPLATE_FILES}, anchor
    # inserting a section renumbers those after it, with no template touched
    inserted = report.section_numbers((report.SECTIONS[0], ("new", "New", ()), *report.SECTIONS[1:]))
    assert (inserted["new"], inserted["system"], inserted["scaling"]) == ("2", "3", "5.1")


def test_every_figure_is_in_the_one_list_drawn_and_shown():
    """The figure functions (plots.py, profile_plots.py, model_plots.py), the one list (figure_names.FIGURE_NAMES), the figures the workflow
    declares and those the templates show are the same set."""
    import inspect

    from scalerepro.analysis.presentation import figure_names, model_plots, plots, profile_plots

    drawers = {
        name
        for module in (plots, profile_plots, model_plots)
        for name, function in vars(module).items()
        if inspect.isfunction(function)
        and function.__module__ == module.__name__
        and not name.startswith("_")
        and function.__annotations__.get("return") == "Figure"
        and list(inspect.signature(function).parameters) == ["t"]
    }
    assert drawers - set(plots.STORE_FIGURES) == set(figure_names.FIGURE_NAMES), "a figure function is missing from the list"
    assert tuple(plots.FIGURE_DRAWERS) == figure_names.FIGURE_NAMES == tuple(report.FIGURE_NAMES)
    shown = re.findall(r'figures(?:\.(\w+)|\["(\w+)"\])', "".join(p.read_text() for p in TEMPLATE_FILES))
    assert sorted({a or b for a, b in shown}) == sorted(figure_names.FIGURE_NAMES), "a listed figure is not shown, or one shown is not listed"
    rules = (REPO / "workflow/rules/common.smk").read_text()
    assert "from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES" in rules  # the workflow reads the same list
