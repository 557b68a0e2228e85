"""The error boundary every `python -m scalerepro...` command shares (scalerepro.common.cli):
expected failures are one line and exit 2, with the traceback under --debug only."""

from __future__ import annotations

import argparse
import ast
import errno
import re

import pytest

from scalerepro.common import cli
from scalerepro.common.files import atomic_file

from conftest import REPO

PACKAGE = REPO / "workflow" / "scalerepro"


def _commands() -> list[str]:
    """Every module of the package that runs as a command (it has a ``__main__`` guard)."""
    return sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if 'if __name__ == "__main__":' in path.read_text())


def test_there_are_commands_to_check():
    assert len(_commands()) >= 16


@pytest.mark.parametrize("module", _commands())
def test_every_command_runs_inside_the_error_boundary(module):
    tree = ast.parse((PACKAGE / module).read_text())
    mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    assert len(mains) == 1, f"{module}: one main() per command"
    decorators = [ast.unparse(decorator) for decorator in mains[0].decorator_list]
    assert any(decorator.startswith("error_boundary(") for decorator in decorators), f"{module}: main is not wrapped"
    parsers = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "ArgumentParser" not in parsers, f"{module}: argparse.ArgumentParser prints a usage block, not one line"


def _command(raised: BaseException):
    @cli.error_boundary("scalerepro.example")
    def main(argv: list[str]) -> int:
        raise raised

    return main


@pytest.mark.parametrize(
    "raised, line",
    [
        (cli.CommandError("the store x is damaged: restore it"), "the store x is damaged: restore it"),
        (
            OSError(errno.ENOSPC, "No space left on device", "out.csv"),
            "cannot use out.csv: the file system is full: free space there or write elsewhere, then run again",
        ),
        (OSError(errno.EROFS, "Read-only file system", "/ro/x"), "cannot use /ro/x: the file system is read-only: write elsewhere"),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "tables"), "cannot use tables: it is a directory: name a file"),
        (OSError(errno.EFBIG, "File too large"), "File too large: the file size limit was reached"),
        (
            FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp']"),
            "No usable temporary directory found in ['/tmp']: check free space and permissions on that file system",
        ),
    ],
    ids=["command-error", "disk-full", "read-only", "a-directory", "file-size-limit", "no-temporary-directory"],
)
def test_an_expected_failure_is_one_line_and_exit_2(capsys, raised, line):
    assert _command(raised)([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scalerepro.example: error: ") and line in err and err.count("\n") == 1


def test_debug_shows_the_traceback_and_a_bug_keeps_it(capsys):
    with pytest.raises(cli.CommandError):
        _command(cli.CommandError("x"))(["--debug"])
    assert _command(cli.CommandError("x"))(["--", "-m", "program", "--debug"]) == 2  # the started program's flag
    with pytest.raises(ZeroDivisionError):  # not an expected failure: a bug in scalerepro, with its traceback
        _command(ZeroDivisionError())([])
    assert capsys.readouterr().err.count("\n") == 1


def test_every_parser_takes_debug_and_a_bad_flag_is_one_line(capsys):
    parser = cli.OneLineErrorParser(prog="scalerepro.example")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("list")
    assert parser.parse_args(["list", "--debug"]).debug is True
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--colour"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "scalerepro.example: error: unrecognized arguments: --colour (see --help)\n"


def test_bounded_numbers_and_output_paths(tmp_path):
    count = cli.bounded_int(1, 10)
    assert count("3") == 3
    for text, message in (("0", "0 is outside [1, 10]"), ("11", "11 is outside [1, 10]"), ("two", "'two' is not an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            count(text)
    fraction = cli.bounded_float(0, 1, high_open=True)
    assert fraction("0.5") == 0.5
    for text in ("1", "nan", "-0.1", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="is outside \\[0, 1\\)"):
            fraction(text)
    assert cli.output_path(str(tmp_path / "a.csv")) == tmp_path / "a.csv"
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory: name a file"):
        cli.output_path(str(tmp_path))


def test_an_atomic_write_over_a_directory_is_refused_before_the_work(tmp_path):
    (tmp_path / "tables").mkdir()
    with pytest.raises(IsADirectoryError) as refused, atomic_file(tmp_path / "tables"):
        raise AssertionError("the body ran")
    assert refused.value.filename == str(tmp_path / "tables") and list(tmp_path.iterdir()) == [tmp_path / "tables"]


def test_a_study_matrix_of_another_version_is_one_line_not_a_traceback(tmp_path, capsys):
    """A matrix written before the per_gpu_batch column (store schema 2's studies) was a ValueError traceback."""
    from scalerepro.analysis.tables import aggregate

    matrix = tmp_path / "matrix.csv"
    matrix.write_text("run_id,study,model,gpus,per_rank_batch\nstrong_cnn_g1_r1,strong,cnn,1,8\n")
    out = tmp_path / "tables"
    assert aggregate.main(["--matrix", str(matrix), "--references", str(REPO / "config/references.yaml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{matrix}: the study matrix lacks the columns" in err and "make it again" in err
    assert not out.exists()
