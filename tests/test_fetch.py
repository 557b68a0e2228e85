"""The CIFAR-10 fetch: real sockets, real archives in the official format, no mocks."""

from __future__ import annotations

import hashlib
import http.server
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from scalerepro.data import cifar10
from scalerepro.data.fetch import ARCHIVE_NAME, META, OFFICIAL_SIZE, TEST_BATCH, TRAIN_BATCHES, FetchError, download, main, read_batches

from cifar_archive import Batch, legacy_pickle, meta_file, official_files, random_batches, write_archive
from conftest import free_port


@dataclass(frozen=True)
class Route:
    body: bytes
    declared_length: int | None = None  # a Content-Length larger than the body: the server then hangs up
    stall: bool = False  # send part of the body, then wait without closing (until the fixture ends)


@dataclass(frozen=True)
class Server:
    url: str
    batches: dict[str, Batch]
    md5: str
    archive: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    """A local HTTP server with a good archive, a corrupt copy, a truncated reply, a stalled one, and 404s."""
    batches = random_batches(per_batch=20, seed=0)
    archive = tmp_path_factory.mktemp("staged") / ARCHIVE_NAME
    md5 = write_archive(archive, official_files(batches))
    body = archive.read_bytes()
    corrupt = bytearray(body)
    corrupt[len(body) // 2] ^= 0xFF
    routes = {
        f"/{ARCHIVE_NAME}": Route(body),
        "/corrupt.tar.gz": Route(bytes(corrupt)),
        "/truncated.tar.gz": Route(body[: len(body) // 2], declared_length=len(body)),
        "/stalled.tar.gz": Route(body[:1000], declared_length=len(body), stall=True),
    }
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(route.declared_length or len(route.body)))
            self.end_headers()
            self.wfile.write(route.body)
            self.wfile.flush()
            if route.stall:
                release.wait(30)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield Server(f"http://127.0.0.1:{httpd.server_address[1]}", batches, md5, archive)
    release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch, tmp_path) -> None:
    # A proxy from the environment would intercept the requests to 127.0.0.1; and no temporary
    # file may be created anywhere else, which the tests check in this private temp directory.
    monkeypatch.setenv("no_proxy", "*")
    scratch = tmp_path / "system-tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalerepro.data.fetch: error: "), err
    return lines[0]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_fetch_converts_chw_batches_to_the_prepared_layout_and_a_second_run_is_a_no_op(server, tmp_path, capsys):
    out = tmp_path / "data" / "cifar10"
    assert main(["--out", str(out), "--url", f"{server.url}/{ARCHIVE_NAME}", "--md5", server.md5]) == 0

    splits = cifar10.load(out)
    train, test = server.batches[TRAIN_BATCHES[0]], server.batches[TEST_BATCH]
    red, green, blue = train.data[3, 5 * 32 + 7], train.data[3, 1024 + 5 * 32 + 7], train.data[3, 2048 + 5 * 32 + 7]
    assert splits["train"].images[3, 5, 7].tolist() == [red, green, blue]  # image 3, row 5, column 7
    expected = np.concatenate([server.batches[name].data for name in TRAIN_BATCHES]).reshape(-1, 3, 32, 32)
    assert np.array_equal(splits["train"].images, expected.transpose(0, 2, 3, 1))
    assert splits["train"].labels.tolist() == sum((server.batches[name].labels for name in TRAIN_BATCHES), [])
    assert np.array_equal(splits["test"].images, test.data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    assert splits["test"].labels.tolist() == test.labels
    manifest = (out / cifar10.DATASET_MANIFEST).read_text()
    assert f"{server.url}/{ARCHIVE_NAME} (md5 {server.md5})" in manifest
    assert tree(out.parent) == {"cifar10", ARCHIVE_NAME, *(f"cifar10/{p}" for p in tree(out))}  # no .part left
    assert hashlib.md5((out.parent / ARCHIVE_NAME).read_bytes()).hexdigest() == server.md5

    before = (out / cifar10.DATASET_MANIFEST).stat().st_mtime_ns
    capsys.readouterr()
    assert main(["--out", str(out), "--url", f"{server.url}/missing.tar.gz", "--md5", server.md5]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (out / cifar10.DATASET_MANIFEST).stat().st_mtime_ns == before


def test_a_kept_download_is_reused_once_verified(server, tmp_path, capsys):
    downloads = tmp_path / "downloads"
    assert main(["--out", str(tmp_path / "a"), "--url", f"{server.url}/{ARCHIVE_NAME}", "--md5", server.md5, "--download-dir", str(downloads)]) == 0
    capsys.readouterr()
    # The URL now fails, so a second success can only come from the kept archive.
    assert main(["--out", str(tmp_path / "b"), "--url", f"{server.url}/missing.tar.gz", "--md5", server.md5, "--download-dir", str(downloads)]) == 0
    assert "using the verified archive" in capsys.readouterr().out
    assert np.array_equal(cifar10.load(tmp_path / "a")["train"].images, cifar10.load(tmp_path / "b")["train"].images)


def test_a_pre_staged_archive_works_offline_and_is_still_verified(server, tmp_path, capsys):
    out = tmp_path / "cifar10"
    assert main(["--out", str(out), "--archive", str(server.archive), "--md5", server.md5]) == 0
    assert cifar10.load(out)["test"].labels.tolist() == server.batches[TEST_BATCH].labels

    assert main(["--out", str(tmp_path / "other"), "--archive", str(server.archive)]) == 2  # the official md5
    size = server.archive.stat().st_size
    assert f"{ARCHIVE_NAME} has {size} bytes, but the CIFAR-10 archive has {OFFICIAL_SIZE}" in one_error_line(capsys)
    assert not (tmp_path / "other").exists()


def test_skipping_the_checksum_warns_and_records_the_actual_md5(server, tmp_path, capsys):
    out = tmp_path / "cifar10"
    assert main(["--out", str(out), "--archive", str(server.archive), "--md5", ""]) == 0
    assert "warning: --md5 '' skips the checksum" in capsys.readouterr().err
    assert f"(md5 {server.md5}, unverified)" in (out / cifar10.DATASET_MANIFEST).read_text()


@pytest.mark.parametrize(
    "path, message",
    [
        ("/truncated.tar.gz", "truncated download from "),
        ("/corrupt.tar.gz", "checksum mismatch for cifar-10-python.tar.gz: md5 "),
        ("/missing.tar.gz", "answered HTTP 404 Not Found: check --url or pass --archive FILE"),
    ],
)
def test_a_failed_download_is_one_line_and_leaves_nothing(server, tmp_path, capsys, path, message):
    out = tmp_path / "data" / "cifar10"
    assert main(["--out", str(out), "--url", server.url + path, "--md5", server.md5]) == 2
    assert message in one_error_line(capsys)
    assert tree(tmp_path) <= {"data", "system-tmp"}  # at most the (empty) download directory


def test_an_unreachable_host_and_a_stalled_transfer_are_one_line(server, tmp_path, capsys):
    out = str(tmp_path / "cifar10")
    assert main(["--out", out, "--url", f"http://127.0.0.1:{free_port()}/{ARCHIVE_NAME}"]) == 2
    assert "cannot reach http://127.0.0.1:" in (line := one_error_line(capsys)) and "pass --archive FILE" in line

    started = time.monotonic()
    assert main(["--out", out, "--url", f"{server.url}/stalled.tar.gz", "--md5", server.md5, "--timeout", "0.3"]) == 2
    assert "stalled: no data for 0.3 s after 1000 bytes" in one_error_line(capsys)
    assert time.monotonic() - started < 5
    assert tree(tmp_path) == {"system-tmp"}


def test_a_size_other_than_the_official_one_is_refused_before_the_body(server, tmp_path):
    with pytest.raises(FetchError, match=r"offers \d+ bytes, but the CIFAR-10 archive has 170498071: check --url"):
        download(f"{server.url}/{ARCHIVE_NAME}", tmp_path / ARCHIVE_NAME, server.md5, timeout=5, size=170_498_071)
    assert tree(tmp_path) == {"system-tmp"}


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


@pytest.mark.parametrize(
    "member, message",
    [
        (_special("../escape", tarfile.REGTYPE), "archive member '../escape' escapes the target"),
        (_special("cifar-10-batches-py/../../escape", tarfile.REGTYPE), "escapes the target"),
        (_special("/tmp/escape", tarfile.REGTYPE), "archive member '/tmp/escape' escapes the target"),
        (_special("cifar-10-batches-py/escape", tarfile.SYMTYPE, "/etc/passwd"), "is a link (to '/etc/passwd')"),
        (_special("escape", tarfile.LNKTYPE, "cifar-10-batches-py/test_batch"), "is a link"),
        (_special("escape", tarfile.FIFOTYPE), "is a device, FIFO or other special file"),
    ],
)
def test_an_archive_with_an_unsafe_member_is_refused_and_nothing_is_extracted(server, tmp_path, capsys, member, message):
    # The unsafe member comes last, after every batch: the whole archive is checked, not just what is read.
    staged = tmp_path / "staged" / "evil.tar.gz"
    staged.parent.mkdir()
    md5 = write_archive(staged, official_files(server.batches), extra=[(member, b"escaped\n")])
    out = tmp_path / "staged" / "out" / "cifar10"
    assert main(["--out", str(out), "--archive", str(staged), "--md5", md5]) == 2
    line = one_error_line(capsys)
    assert message in line and "refusing the archive" in line
    assert tree(tmp_path) == {"staged", "staged/evil.tar.gz", "system-tmp"}  # the target's parent included
    assert "escape" not in os.listdir(tmp_path.parent)


class _MakeDirectory:
    """Unpickled by an unrestricted pickle, this would create a directory: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.path),)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda files, tmp: files.pop("data_batch_3"), "no member 'cifar-10-batches-py/data_batch_3'"),
        (lambda files, tmp: files.update({META: meta_file(["cat"] * 10)}), "batches.meta names the classes"),
        (
            lambda files, tmp: files.update(test_batch=legacy_pickle({b"data": np.zeros((2, 3071), np.uint8), b"labels": [0, 1]})),
            "test_batch: b'data' is uint8 (2, 3071), expected uint8 (N, 3072)",
        ),
        (
            lambda files, tmp: files.update(test_batch=legacy_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]})),
            "test_batch: labels outside 0..9",
        ),
        (
            lambda files, tmp: files.update(test_batch=legacy_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]})),
            "b'labels' is not a list of 2 ints",
        ),
        (
            lambda files, tmp: files.update(test_batch=pickle.dumps(_MakeDirectory(tmp / "pwned"))),
            "refers to posix.mkdir, which a CIFAR-10 batch never does",
        ),
    ],
    ids=["missing-batch", "wrong-classes", "wrong-shape", "label-range", "label-count", "code-in-pickle"],
)
def test_an_archive_not_in_the_cifar10_format_is_refused(server, tmp_path, capsys, mutate, message):
    files = official_files(server.batches)
    mutate(files, tmp_path)
    staged = tmp_path / "odd.tar.gz"
    assert main(["--out", str(tmp_path / "cifar10"), "--archive", str(staged), "--md5", write_archive(staged, files)]) == 2
    assert message in one_error_line(capsys)
    assert tree(tmp_path) == {"odd.tar.gz", "system-tmp"}  # no output, and no 'pwned' directory


def test_a_file_that_is_not_a_tar_gz_and_an_unusable_output_dir_are_one_line(tmp_path, capsys):
    staged = tmp_path / "noise.tar.gz"
    staged.write_bytes(np.random.default_rng(0).bytes(4096))
    md5 = hashlib.md5(staged.read_bytes()).hexdigest()
    assert main(["--out", str(tmp_path / "cifar10"), "--archive", str(staged), "--md5", md5]) == 2
    assert f"cannot read '{staged}' as a tar.gz archive" in one_error_line(capsys)

    (tmp_path / "occupied").mkdir()
    assert main(["--out", str(tmp_path / "occupied"), "--archive", str(staged)]) == 2
    assert f"'{tmp_path / 'occupied'}' exists but is not a prepared CIFAR-10 directory: remove it" in one_error_line(capsys)


def test_read_batches_returns_hwc_splits(server):
    splits = read_batches(server.archive)
    assert splits["train"].images.shape == (100, 32, 32, 3) and splits["train"].labels.dtype == np.int64
    assert splits["test"].images.shape == (20, 32, 32, 3)


def test_bad_flags_exit_2_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path), "--md5", "c58f"])
    assert exit_info.value.code == 2
    assert "argument --md5: 'c58f' is not an MD5" in one_error_line(capsys)


def run_cli(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "scalerepro.data.fetch", *args]
    env = {**os.environ, "no_proxy": "*"}
    return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_cli_as_a_process_fails_with_one_line_and_needs_no_torch(server, tmp_path):
    process = run_cli("--out", str(tmp_path / "cifar10"), "--url", f"{server.url}/missing.tar.gz")
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert stderr.count("\n") == 1 and stderr.startswith("scalerepro.data.fetch: error: ") and "HTTP 404" in stderr

    probe = "import sys, scalerepro.data.fetch; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0


def test_sigterm_mid_download_removes_the_part_file(server, tmp_path):
    process = run_cli("--out", str(tmp_path / "cifar10"), "--url", f"{server.url}/stalled.tar.gz", "--md5", server.md5)
    deadline = time.monotonic() + 20
    while not any(tmp_path.glob("*.part")):  # the reply has begun: the server now stalls mid-body
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 128 + signal.SIGTERM
    assert stderr == "scalerepro.data.fetch: error: stopped by SIGTERM; nothing partial is kept: run again\n"
    assert tree(tmp_path) == {"system-tmp"}


def test_a_fetch_killed_half_way_leaves_staging_that_the_next_run_removes(server, tmp_path, capsys):
    """SIGKILL skips every cleanup: the next run removes a dead writer's staging directory (and
    the pid-less ones of earlier versions) but never a live writer's."""
    out = tmp_path / "cifar10"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, tempfile, time; "
            f"d = tempfile.mkdtemp(prefix='.cifar10.%d.' % os.getpid(), dir={str(tmp_path)!r}); "
            "open(os.path.join(d, 'train_images.npy'), 'wb').write(b'half'); print(d, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    dead = Path(writer.stdout.readline().strip())
    writer.kill()
    writer.wait()
    legacy = tmp_path / ".cifar10.k3x9q_"
    live = tmp_path / f".cifar10.{os.getpid()}.abc"
    for directory in (legacy, live):
        directory.mkdir()
    assert main(["--out", str(out), "--archive", str(server.archive), "--md5", server.md5]) == 0
    assert not dead.exists() and not legacy.exists() and live.is_dir()
    assert f"removed '{dead}', left half-written by a fetch that was killed" in capsys.readouterr().out
    assert cifar10.load(out)["train"].labels.size
