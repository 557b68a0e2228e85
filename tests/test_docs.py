"""The README and docs/ name only what exists: every command they give runs (its `--help`, or a
Snakemake dry run), every flag they give a program is in that program's `--help`, and every
module path (`scalerepro.x.y`) and repository file they name is there. A doc that drifts from
the code fails here, naming the file, the command and the flag."""

from __future__ import annotations

import ast
import functools
import glob
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from workflow_runs import COPY_IGNORE, SNAKEMAKE, workflow_env

PACKAGE = REPO / "workflow" / "scalerepro"
PYTHON = [sys.executable]


def doc_text(path: Path) -> str:
    """A doc's current text: of benchmarks/README.md only its opening table of current figures
    (the journal below it keeps each command as it was run that day)."""
    text = path.read_text(encoding="utf-8")
    if path == REPO / "benchmarks" / "README.md":
        text = text.split("\n# The journal", 1)[0]
    return text


def checked_files() -> list[Path]:
    """The files whose commands a reader types: the README, docs/, the config's README and the
    benchmarks' table of current figures."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "config" / "README.md", REPO / "benchmarks" / "README.md"]


# ------------------------------------------------------------------------------------------
# Reading commands out of Markdown
# ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", ""}
# Where a program's name begins a command line: the interpreters the docs write, then the program.
ENVIRONMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
PROGRAM_START = re.compile(r"^(?:python3?|\.venv/bin/python|torchrun|snakemake|bash|\.venv/bin/snakemake)$")


def fenced_commands(text: str) -> list[str]:
    """Each command line of the shell blocks: continuation lines joined, comments dropped."""
    lines = []
    for language, body in FENCE.findall(text):
        if language not in SHELL_LANGUAGES:
            continue
        lines += body.replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def inline_commands(text: str) -> list[str]:
    """Inline code that is a command: it begins with a program this repository runs."""
    out = []
    for span in INLINE.findall(FENCE.sub("", text)):
        words = span.split()
        while words and ENVIRONMENT.match(words[0]):
            words = words[1:]
        if len(words) > 1 and PROGRAM_START.match(words[0]):
            out.append(span)
    return out


def simple_commands(line: str) -> list[list[str]]:
    """A shell line split into its simple commands (at &&, ||, ;, |, braces), comments dropped,
    environment assignments in front of a command left out."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|{}")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:
        return []
    commands, current = [], []
    for token in tokens:
        if token and set(token) <= set(";&|{}"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    out = []
    for command in commands:
        while command and ENVIRONMENT.match(command[0]):
            command = command[1:]
        if command:
            out.append(command)
    return out


def program_of(command: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
    """(the program, as the words that start it with --help appended; its arguments) for a
    command of this repository's programs, else None (pip, apt-get, cp: not ours to check)."""
    words = list(command)
    if words[0] == "torchrun":
        if "-m" not in words:
            return None
        words = ["python", *words[words.index("-m") :]]
    if words[0] in ("python", "python3", ".venv/bin/python"):
        if len(words) > 2 and words[1] == "-m" and re.fullmatch(r"scalerepro(\.\w+)+", words[2]):
            module, args = words[2], words[3:]
            sub = subcommand(module, args)
            return (("-m", module, sub) if sub else ("-m", module)), args[1:] if sub else args
        if len(words) > 1 and words[1].startswith("benchmarks/") and words[1].endswith(".py"):
            return (words[1],), words[2:]
        return None
    if words[0] in ("snakemake", ".venv/bin/snakemake"):
        return ("snakemake",), words[1:]
    return None


@functools.cache
def help_text(program: tuple[str, ...]) -> str:
    """What `program --help` prints; the test fails where it does not exit 0."""
    argv = [*SNAKEMAKE, "--help"] if program == ("snakemake",) else [*PYTHON, *program, "--help"]
    done = subprocess.run(argv, cwd=REPO, env=workflow_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)} exits {done.returncode}: {done.stderr[-1500:]}"
    return done.stdout


def subcommand(module: str, args: list[str]) -> str | None:
    """The subcommand a command names (`store list`, `bundle import`), where its module has any."""
    if not args or args[0].startswith("-"):
        return None
    choices = re.search(r"\{([\w,-]+)\}", help_text(("-m", module)))
    if choices and args[0] in choices.group(1).split(","):
        return args[0]
    return None


FLAG = re.compile(r"^--[a-z][a-z0-9-]*")


def lists(help_output: str, flag: str) -> bool:
    """Whether a `--help` lists ``flag`` itself (not a longer flag it begins)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_output) is not None


def flags_of(args: list[str]) -> list[str]:
    """The long flags an argument list gives (`--x=1` is `--x`)."""
    return [FLAG.match(arg).group(0) for arg in args if FLAG.match(arg)]


def documented_commands() -> list[tuple[str, list[str]]]:
    """(the doc it is in, the simple command) for every command line of the docs."""
    out = []
    for path in checked_files():
        text = doc_text(path)
        for line in [*fenced_commands(text), *inline_commands(text)]:
            out += [(str(path.relative_to(REPO)), command) for command in simple_commands(line)]
    return out


def program_commands() -> list[tuple[str, tuple[str, ...], list[str]]]:
    out = []
    for doc, command in documented_commands():
        found = program_of(command)
        if found:
            out.append((doc, *found))
    return out


# ------------------------------------------------------------------------------------------
# Flags named alone (`--bucket-cap-mb`), and to which program they belong
# ------------------------------------------------------------------------------------------

# The programs whose flags each doc names alone, in its prose and tables, besides those its
# commands run.
PROGRAMS_OF_DOC = {
    "README.md": [("snakemake",)],
    "docs/trainer.md": [("-m", "scalerepro.training.train")],
    "docs/run-record.md": [("-m", "scalerepro.training.train"), ("-m", "scalerepro.analysis.rebuild")],
    "docs/profiling.md": [("-m", "scalerepro.training.train"), ("-m", "scalerepro.analysis.profiles.captures", "summarize")],
    "docs/results-store.md": [
        ("-m", "scalerepro.analysis.history.compare"),
        ("-m", "scalerepro.analysis.history.bundle", "import"),
        ("-m", "scalerepro.analysis.history.bundle", "export"),
    ],
    "docs/study.md": [("snakemake",), ("-m", "scalerepro.analysis.rebuild"), ("-m", "scalerepro.training.train")],
    "docs/slurm.md": [("snakemake",), ("-m", "scalerepro.training.train")],
    "docs/benchmarks.md": [("-m", "scalerepro.training.train"), ("benchmarks/trainer_throughput.py",)],
    "docs/install.md": [],
    "docs/prescreen.md": [("snakemake",), ("-m", "scalerepro.training.node_check"), ("-m", "scalerepro.planning.node_screen")],
    "docs/scaling-model.md": [("-m", "scalerepro.analysis.predict")],
    "docs/architecture.md": [],
    "config/README.md": [("snakemake",), ("-m", "scalerepro.training.train")],
    "benchmarks/README.md": [],
}
# Flags the docs give to programs this repository does not own: each with its program, which the
# sentence names beside it.
FOREIGN_FLAGS = {
    "--tp-comm-overlap": "Megatron-LM (the 3D step, docs/scaling-model.md)",
    "--nodelist": "sbatch (the prescreen's job on its node, docs/prescreen.md)",
    "--exclude": "sbatch (the scaling runs kept off excluded nodes, docs/prescreen.md)",
    "--trace": "nsys",
    "--capture-range": "nsys",
    "--type": "nsys export",
    "--filter-mode": "ncu",
    "--launch-count": "ncu",
    "--clock-control": "ncu",
    "--metrics": "ncu",
    "--print-metric-name": "ncu",
    "--print-units": "ncu",
    "--kernel-name": "ncu",
    "--nv": "apptainer exec",
    "--exclusive": "sbatch",
    "--gres": "sbatch",
    "--signal": "sbatch",
    "--cpu-bind": "srun",
    "--nodes": "srun",
    "--ntasks": "srun",
    "--ntasks-per-node": "srun",
    "--format": "sacct",
}


def lone_flags(text: str) -> list[str]:
    """Flags in inline code outside commands: `--x`, `--x y`, `--[no-]x` (both spellings)."""
    found = []
    for span in INLINE.findall(FENCE.sub("", text)):
        words = span.split()
        if not words or PROGRAM_START.match(words[0]):
            continue
        for word in words:
            optional = re.match(r"^--\[no-\]([a-z][a-z0-9-]*)", word)
            if optional:
                found += [f"--{optional.group(1)}", f"--no-{optional.group(1)}"]
            elif FLAG.match(word):
                found.append(FLAG.match(word).group(0))
    return found


# ------------------------------------------------------------------------------------------
# Module paths and file paths
# ------------------------------------------------------------------------------------------

MODULE_PATH = re.compile(r"(?<![\w/.-])scalerepro(?:\.[A-Za-z_]\w*)+")


def module_file(parts: list[str]) -> Path | None:
    base = PACKAGE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (read, not imported: no torch)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def missing_module_path(dotted: str) -> str | None:
    """Why `scalerepro.a.b.Name[.attr]` does not exist, or None where it does: the longest
    prefix must be a module and the next name one it defines."""
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        path = module_file(parts[:cut]) if cut else PACKAGE / "__init__.py"
        if path is None:
            continue
        rest = parts[cut:]
        if not rest or rest[0] in top_level_names(path):
            return None
        return f"{'.'.join(['scalerepro', *parts[:cut]])} defines no {rest[0]}"
    return "no such module"


# The folders a path in the docs starts from: the repository's, and the package's, whose
# modules the docs name from inside (`training/trainer.py`).
REPO_TOPS = {p.name for p in REPO.iterdir() if p.name not in {"results", ".git", ".venv", ".snakemake"}}
PACKAGE_TOPS = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
PATH_TOKEN = re.compile(r"^[\w.-]+(?:/[\w.*<>\[\]{}…-]*)+$")


def path_tokens(text: str) -> list[str]:
    """Repository paths in inline code and links: a token with a slash whose first part is a
    folder of the repository or of the package."""
    tokens = [word for span in INLINE.findall(FENCE.sub("", text)) for word in span.split()]
    tokens += re.findall(r"\]\(([^)#\s]+)", text)
    out = []
    for token in tokens:
        token = token.strip("`,;:()'\"").split("::")[0].rstrip(".")
        token = re.sub(r"^(\.\./)+", "", token)
        if not PATH_TOKEN.match(token) or token.startswith(("http", "/")):
            continue
        first = token.split("/")[0]
        if first in REPO_TOPS or first in PACKAGE_TOPS:
            out.append(token)
    return out


def path_exists(token: str, doc: Path) -> bool:
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}|…", "*", token)
    roots = (REPO, PACKAGE, doc.parent)
    return any(glob.glob(str(root / pattern)) for root in roots)


# ------------------------------------------------------------------------------------------
# The tests
# ------------------------------------------------------------------------------------------


def test_the_docs_give_commands_to_check():
    """The parser finds the README's commands: a doc whose blocks it cannot read checks nothing."""
    programs = {program for _, program, _ in program_commands()}
    assert ("snakemake",) in programs
    assert ("-m", "scalerepro.analysis.rebuild") in programs
    assert ("-m", "scalerepro.training.train") in programs
    assert any(program[0].startswith("benchmarks/") for program in programs)


def test_every_python_command_of_the_docs_runs_with_its_flags():
    """Each `python -m scalerepro...` and benchmark script the docs give answers `--help`, and
    every flag the docs give it is one its `--help` lists."""
    wrong = []
    for doc, program, args in program_commands():
        if program == ("snakemake",):
            continue
        listed = help_text(program)
        wrong += [f"{doc}: {' '.join(program)} has no {flag}" for flag in flags_of(args) if not lists(listed, flag)]
    assert wrong == []


def handled_words(script: str) -> set[str]:
    """The words a shell script dispatches on: its `case` labels (`start)`, `a | b)`) and the
    words of its usage line."""
    labels = re.findall(r"^\s*([\w-]+(?:\s*\|\s*[\w-]+)*)\)", script, re.M)
    words = {word.strip() for label in labels for word in label.split("|")}
    for usage in re.findall(r"usage: ([^\n]*)", script):
        words |= set(re.findall(r"[\w-]+", usage))
    return words


def test_every_script_of_the_docs_takes_the_stages_they_give_it():
    """A repository shell script the docs run (`bash benchmarks/gpu/smoke.sh cells`,
    `tests/slurm/cluster.sh start`) exists, and each word given it is one the script handles."""
    wrong, seen = [], 0
    for doc, command in documented_commands():
        words = command[1:] if command[0] == "bash" else command
        if not words or not words[0].endswith(".sh"):
            continue
        if not (REPO / words[0]).is_file():
            wrong.append(f"{doc}: {words[0]} does not exist")
            continue
        seen += 1
        handled = handled_words((REPO / words[0]).read_text(encoding="utf-8"))
        wrong += [f"{doc}: {words[0]} handles no {word!r}" for word in words[1:] if re.fullmatch(r"[a-z]+", word) and word not in handled]
    assert seen and wrong == []


@pytest.mark.slow
def test_every_snakemake_flag_of_the_docs_is_snakemakes():
    """Each flag a doc gives snakemake, in a command or alone, is one `snakemake --help` lists."""
    listed = help_text(("snakemake",))
    wrong = [
        f"{doc}: snakemake has no {flag}"
        for doc, program, args in program_commands()
        if program == ("snakemake",)
        for flag in flags_of(args)
        if not lists(listed, flag)
    ]
    assert wrong == []


def test_every_flag_named_alone_is_a_flag_of_its_doc_s_programs():
    """A flag a doc names in its prose or tables (`--bucket-cap-mb`) is in the `--help` of one of
    the programs that doc is about, or is a flag of another tool, named with it."""
    wrong, foreign = [], set()
    for path in checked_files():
        doc = str(path.relative_to(REPO))
        foreign |= set(lone_flags(doc_text(path))) & set(FOREIGN_FLAGS)
        programs = [p for p in PROGRAMS_OF_DOC[doc] if p != ("snakemake",)]
        programs += [program for of, program, _ in program_commands() if of == doc and program != ("snakemake",) and program not in programs]
        for flag in lone_flags(doc_text(path)):
            if flag in FOREIGN_FLAGS:
                continue
            if ("snakemake",) in PROGRAMS_OF_DOC[doc] and flag in snakemake_flags():
                continue
            if not any(lists(help_text(program), flag) for program in programs):
                wrong.append(f"{doc}: {flag} is no flag of {', '.join(' '.join(p) for p in PROGRAMS_OF_DOC[doc]) or 'any program it names'}")
    assert wrong == []
    assert sorted(set(FOREIGN_FLAGS) - foreign) == [], "flags of other tools that no doc names any more"


@functools.cache
def snakemake_flags() -> frozenset[str]:
    """Snakemake's flags, read from its argument parser without starting it (its `--help` is the
    slow test's)."""
    from snakemake.cli import get_argument_parser

    return frozenset(option for action in get_argument_parser()._actions for option in action.option_strings)


def test_every_module_path_the_docs_name_exists():
    wrong = []
    for path in checked_files():
        for dotted in sorted(set(MODULE_PATH.findall(doc_text(path)))):
            why = missing_module_path(dotted)
            if why:
                wrong.append(f"{path.relative_to(REPO)}: {dotted}: {why}")
    assert wrong == []


def test_every_repository_path_the_docs_name_exists():
    wrong = []
    for path in checked_files():
        for token in sorted(set(path_tokens(doc_text(path)))):
            if not path_exists(token, path):
                wrong.append(f"{path.relative_to(REPO)}: {token}")
    assert wrong == []


def test_the_architecture_doc_names_every_module_folder_and_module():
    """docs/architecture.md's layout names each folder and module of the package, so that a
    module added or renamed is a line there too."""
    layout = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    names = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    names |= {p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    assert sorted(name for name in names if not re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", layout)) == []


def test_the_readme_lists_every_report_section_on_one_line():
    """The README's "What the report shows" has one line for each section and subsection of
    SECTIONS, in its order."""
    from scalerepro.analysis.presentation.report import SECTIONS

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shows = readme.split("## What the report shows", 1)[1].split("\n## ", 1)[0]
    titles = [title for _, title, subsections in SECTIONS for title in (title, *(sub for _, sub in subsections))]
    listed = re.findall(r"^\s*\d+\. \*\*(.+?)\*\*", shows, re.M)
    assert listed == titles


def test_the_readme_is_short_and_its_first_two_commands_are_the_contract():
    """At most about 150 lines; its first command sets up and runs the study, its second sets up
    and passes the suite, the command .ci/run runs."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    first, second = [body.strip() for _, body in FENCE.findall(readme)[:2]]
    assert first.endswith("snakemake --cores all")
    assert second.endswith(".venv/bin/ruff check && .venv/bin/ruff format --check && .venv/bin/mypy && .venv/bin/pytest")


def test_a_flag_that_does_not_exist_fails_the_check(tmp_path):
    """The checks catch a doc naming a flag its program lacks, alone or in a command."""
    doc = "`python -m scalerepro.analysis.rebuild --results results --no-such-flag`\n\n`--bucket-cap-mib`\n"
    (found,) = [program_of(command) for line in inline_commands(doc) for command in simple_commands(line)]
    program, args = found
    assert "--no-such-flag" in flags_of(args) and not lists(help_text(program), "--no-such-flag")
    assert lone_flags(doc) == ["--bucket-cap-mib"]
    assert not lists(help_text(("-m", "scalerepro.training.train")), "--bucket-cap-mib")
    assert missing_module_path("scalerepro.analysis.rebuild.no_such_name")
    assert not path_exists("workflow/scalerepro/no_such_module.py", REPO / "README.md")


def snakemake_dry_runs() -> list[tuple[str, list[str]]]:
    """The snakemake commands of the docs that plan on this machine: not the Slurm profile's
    (they ask a controller), not the lock's, not `--report` (which writes a report of a finished
    study, and has no dry run), nor those with a placeholder."""
    out = []
    for doc, program, args in program_commands():
        text = " ".join(args)
        if program != ("snakemake",) or {"--profile", "--unlock", "--report"} & set(args) or re.search(r"[<…]|tests/slurm", text):
            continue
        if "baseline:" in text:
            continue  # needs a stored study of that id
        out.append((doc, [arg for arg in args if arg not in ("-n", "--dry-run")]))
    return out


@pytest.mark.slow
def test_every_snakemake_command_of_the_docs_plans(tmp_path):
    """Each snakemake command the docs give, as a dry run in a copy of the repository."""
    workdir = tmp_path / "scalerepro"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    seen, failed = set(), []
    for doc, args in snakemake_dry_runs():
        if tuple(args) in seen:
            continue
        seen.add(tuple(args))
        for name in args[args.index("--configfile") + 1 :] if "--configfile" in args else []:
            if name.startswith("-"):
                break
            if not (workdir / name).exists():
                (workdir / name).write_text("{}\n")  # a reader's own config file: an empty one stands in
        done = subprocess.run([*SNAKEMAKE, *args, "-n"], cwd=workdir, env=workflow_env(), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            failed.append(f"{doc}: snakemake {' '.join(args)} -n exits {done.returncode}: {done.stderr[-800:]}")
    assert len(seen) >= 3
    assert failed == []


def test_ci_runs_exactly_the_readmes_second_command():
    """CI's entry point is the README's second command, word for word: a step added to one and not
    the other (a linter, a type checker) would let the README promise what CI does not check."""
    second = fenced_commands((REPO / "README.md").read_text())[1]
    ci_lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci_lines == [second]
