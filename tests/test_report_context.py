"""The report's context is typed and its templates are strict: a name or key that nothing set is an error naming it, never a "—".

The report renders a ``report.ReportContext`` (built by ``report.build_context``), a frozen dataclass
with one field per name the templates read, under Jinja's StrictUndefined. A misspelt name or key in
a template, a key a section's mapping lacks and a field the context is built without (or with one it
does not declare) each fail, naming it; with Jinja's lenient Undefined each rendered as an empty
value or "—" and no test noticed. A value that may be absent is None on purpose and still shows as
a hole, as the last tests check.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import jinja2
import jinja2.meta
import jinja2.nodes
import pandas as pd
import pytest
import yaml

from scalerepro.analysis.presentation import report

from report_study import REFERENCES, TEMPLATES, list_table_digests, section, write_study


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict[str, Path]:
    return write_study(tmp_path_factory.mktemp("study"))


@pytest.fixture(scope="module")
def context(study) -> report.ReportContext:
    return report.build_context(study["tables"], study["plots"], study["inventory"], study["config"], REFERENCES)


def templates_with(tmp_path: Path, template: str, old: str, new: str) -> Path:
    """A copy of the report's templates folder with ``old`` written as ``new`` in ``template`` (once)."""
    copy = tmp_path / "report"
    shutil.copytree(TEMPLATES, copy)
    path = copy / "templates" / template
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} is not once in {template}"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return copy


def test_the_context_renders_as_the_report(context):
    page = report.render_context(context, TEMPLATES)
    assert "<dt>Models</dt><dd>bert_base, resnet50</dd>" in page and "UTC from the tables in" in page


# A misspelt top-level name: printed, and tested by an `if`.
@pytest.mark.parametrize(
    ("template", "old", "new", "named"),
    [
        ("report.html.j2", "{{ generated_at }}", "{{ generated_att }}", "'generated_att' is undefined"),
        ("sections/summary.html.j2", "{% if cpu_study %}", "{% if cpu_studdy %}", "'cpu_studdy' is undefined"),
    ],
)
def test_a_misspelt_name_in_a_template_fails_the_render_naming_it(context, tmp_path, template, old, new, named):
    with pytest.raises(jinja2.UndefinedError, match=re.escape(named)):
        report.render_context(context, templates_with(tmp_path, template, old, new))


# A misspelt key of a section's mapping: printed through a filter that used to say "—" for it
# (join, text), and under the templates' `missing` test, which used to call it missing.
@pytest.mark.parametrize(
    ("template", "old", "new", "named"),
    [
        ("sections/summary.html.j2", '{{ o.models | join(", ") or MISSING }}', '{{ o.modles | join(", ") or MISSING }}', "has no attribute 'modles'"),
        (
            "sections/comparison.html.j2",
            'length }}" class="source">{{ peak.source | text }}',
            'length }}" class="source">{{ peak.sources | text }}',
            "has no attribute 'sources'",
        ),
        ("sections/comparison.html.j2", "{% if r.best is missing %}", "{% if r.bets is missing %}", "has no attribute 'bets'"),
    ],
)
def test_a_misspelt_key_of_a_section_fails_the_render_naming_it(context, tmp_path, template, old, new, named):
    with pytest.raises(jinja2.UndefinedError, match=re.escape(named)):
        report.render_context(context, templates_with(tmp_path, template, old, new))


def test_a_key_a_section_lacks_fails_the_render_naming_it(context):
    forgot = dataclasses.replace(context, overview={key: value for key, value in context.overview.items() if key != "models"})
    with pytest.raises(jinja2.UndefinedError, match="has no attribute 'models'"):
        report.render_context(forgot, TEMPLATES)


def test_a_context_without_a_field_or_with_an_undeclared_one_is_not_built(context):
    fields = context.variables()
    with pytest.raises(TypeError, match="'overview'"):
        report.ReportContext(**{name: value for name, value in fields.items() if name != "overview"})
    with pytest.raises(TypeError, match="'overveiw'"):
        report.ReportContext(**fields, overveiw=fields["overview"])


def test_every_name_the_templates_read_is_a_field_and_every_field_is_read():
    """Also in the branches no fixture renders: a name read is a field, a global, or set in the templates."""
    environment = report.make_environment(TEMPLATES)
    fields = {field.name for field in dataclasses.fields(report.ReportContext)}
    read, assigned = set(), set()
    for path in sorted((TEMPLATES / "templates").rglob("*.j2")):
        parsed = environment.parse(path.read_text(encoding="utf-8"))
        read |= jinja2.meta.find_undeclared_variables(parsed)
        assigned |= {node.name for node in parsed.find_all(jinja2.nodes.Name) if node.ctx in ("store", "param")}
    assert read - fields - set(environment.globals) - assigned == set()
    assert fields - read == set(), "a field no template reads"


# An absent value is still a hole, on purpose.


def test_runs_without_the_peak_memory_kind_show_the_headline_peak_memory_without_it(study, tmp_path):
    runs = pd.read_csv(study["tables"] / "runs.csv").drop(columns=["peak_memory_kind"])
    tables = tmp_path / "tables"
    shutil.copytree(study["tables"], tables)
    runs.to_csv(tables / "runs.csv", index=False)
    list_table_digests(tables)  # the test's change stands in for the aggregation's table
    page = report.render(tables, study["plots"], study["inventory"], study["config"], REFERENCES, TEMPLATES)
    headline = "".join(re.findall(r'<table class="headline">.*?</table>', section(page, "summary"), re.S))  # a table per unit
    assert "38.7 GiB" in headline and "reserved, an upper bound" not in headline and "RSS of a rank" not in headline


def test_a_link_that_states_no_efficiency_shows_the_models_default_and_no_source(study, tmp_path):
    references = yaml.safe_load(REFERENCES.read_text(encoding="utf-8"))
    del references["links"]["intra_node"]["efficiency"], references["links"]["intra_node"]["efficiency_source"]
    (tmp_path / "references.yaml").write_text(yaml.safe_dump(references, sort_keys=False), encoding="utf-8")
    page = report.render(study["tables"], study["plots"], study["inventory"], study["config"], tmp_path / "references.yaml", TEMPLATES)
    row = re.search(r"<tr><td>intra_node</td>.*?</tr>", page).group(0)
    assert '<td class="num">0.85</td>' in row and "efficiency: —;" in row
