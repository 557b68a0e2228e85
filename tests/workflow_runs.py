"""Running the workflow in tests: Snakemake in a copy of the repository with this interpreter's
environment, and a local HTTP server that serves a small CIFAR-10 archive in the official format."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cifar_archive import Batch, official_files, write_archive
from conftest import clean_env, learnable_cifar_split

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
COPY_IGNORE = shutil.ignore_patterns(".venv", "results", ".git", ".snakemake", "__pycache__", "*.egg-info", ".pytest_cache", ".whl", ".gl")


def workflow_env(**extra: str) -> dict[str, str]:
    # The rules call `python`: make it this interpreter (the environment with every extra).
    return clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra)


def snakemake(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, *args], cwd=workdir, env=workflow_env(), capture_output=True, text=True, timeout=timeout)


def _archive_batches(seed: int) -> dict[str, Batch]:
    """The five training batches and the test batch, learnable (class patterns), in CHW rows."""

    def rows(split):
        return Batch(split.images.transpose(0, 3, 1, 2).reshape(len(split.labels), 3072).copy(), split.labels.tolist())

    batches = {f"data_batch_{i}": rows(learnable_cifar_split(100, seed + i)) for i in range(1, 6)}
    batches["test_batch"] = rows(learnable_cifar_split(200, seed + 10))
    return batches


@pytest.fixture(scope="module")
def cifar_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    md5 = write_archive(root / "cifar-10-python.tar.gz", official_files(_archive_batches(seed=0)))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/cifar-10-python.tar.gz", md5
    httpd.shutdown()
    httpd.server_close()
