"""A compile cache file is code: a run loads only one this user's runs wrote and signed, from a file
and folder no one else can write, whose artifact keys stay inside torch's cache folder. Anything
else is named in the record and the log, and the run compiles cold."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from torch.compiler._cache import CacheArtifactFactory, CacheArtifactManager, _serialize_single_cache
from torch.utils._appending_byte_serializer import AppendingByteSerializer, BytesWriter

from scalerepro.training import cache_trust, compilation
from scalerepro.training.run_setup import private_compile_cache

from conftest import clean_env, load_record, python_train

NOBODY = 65534  # another user's uid
BEST_CONFIG = b'{"XBLOCK": 64, "num_warps": 4}'  # an autotune artifact: torch writes its bytes as they are


def torch_cache(*artifacts: tuple[str, str, bytes]) -> bytes:
    """Cache bytes in torch's own format, made with torch's own serializer, as anyone can."""
    CacheArtifactManager._ensure_cache_artifacts_registered()
    by_kind: dict[str, list] = {}
    for kind, key, content in artifacts:
        by_kind.setdefault(kind, []).append(CacheArtifactFactory.create(kind, key, content))
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(by_kind.items())
    return serializer.to_bytes()


def with_torch_checksum(payload: bytes) -> bytes:
    """``payload`` with torch's CRC-32 made right again, as someone who changed it would."""
    return zlib.crc32(payload[4:]).to_bytes(4, "big") + payload[4:]


def plant(path: Path, data: bytes) -> None:
    """A file as a user's own, whatever this process's umask: writable by its owner alone, in a folder likewise."""
    path.parent.mkdir(exist_ok=True)
    path.parent.chmod(0o755)
    path.write_bytes(data)
    path.chmod(0o644)


@pytest.fixture
def user(tmp_path, monkeypatch):
    """This user's config folder (where the key lives) and torch's cache folder, both under tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path


def load(path: Path) -> compilation.CompileFacts:
    facts = compilation.CompileFacts(scope="model", cache_file=str(path))
    compilation.load_cache(facts)
    return facts


def refused(facts: compilation.CompileFacts, why: str) -> bool:
    reason = facts.cache_reason or ""
    return facts.cache_loaded is None and reason.startswith(f"{facts.cache_file} could not be loaded (") and why in reason and "\n" not in reason


@pytest.fixture
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


@pytest.mark.parametrize("umask", [0o022, 0o002], indirect=True, ids=["umask-022", "umask-002-as-on-clusters"])
def test_this_users_signed_cache_loads_and_its_key_is_private(user, umask):
    cache = user / "caches" / "cache.bin"
    cache_trust.write_signed(cache, torch_cache(("autotune", "ab/abcdef.best_config", BEST_CONFIG)))
    facts = load(cache)
    assert facts.cache_loaded == {"autotune": 1} and facts.cache_reason is None, facts
    assert (user / "inductor" / "ab" / "abcdef.best_config").read_bytes() == BEST_CONFIG
    key = cache_trust.key_path()
    assert key.is_relative_to(user / "config") and key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    assert cache.stat().st_mode & 0o022 == 0 and cache.parent.stat().st_mode & 0o022 == 0


ESCAPES = [
    pytest.param("autotune", "{outside}/sitecustomize.py", id="absolute-key"),
    pytest.param("autotune", "../outside/sitecustomize.py", id="dot-dot-key"),
    pytest.param("aot_autograd", "../../outside", id="dot-dot-aot-key"),
]


@pytest.mark.parametrize(("kind", "key"), ESCAPES)
@pytest.mark.parametrize("signed", [False, True], ids=["planted", "signed-by-this-user"])
def test_a_cache_whose_keys_leave_torchs_folder_is_refused_and_writes_nothing_outside(user, kind, key, signed):
    """An attacker's file in torch's real format, its key a path out of torch's cache folder. Unsigned,
    the signature refuses it; signed with this user's key (a cache re-signed in error), the key check."""
    outside = user / "outside"
    payload = torch_cache((kind, key.format(outside=outside), b"import os  # runs in every later Python\n"))
    cache = user / "caches" / "cache.bin"
    if signed:
        cache_trust.write_signed(cache, payload)
    else:
        plant(cache, payload)
    facts = load(cache)
    assert refused(facts, "names a path outside torch's cache folder" if signed else "it is not signed by a scalerepro run"), facts
    assert not outside.exists()


def test_an_inductor_key_whose_folder_part_is_absolute_is_refused():
    """Inductor files an artifact under ``key[1:3]`` first: 'x/tmp' puts '/t' there, the root's."""
    with pytest.raises(cache_trust.CacheRefused, match="names a path outside torch's cache folder"):
        cache_trust.check_keys_stay_inside(torch_cache(("inductor", "x/tmp/planted", b"pickle")))
    cache_trust.check_keys_stay_inside(torch_cache(("inductor", "fabcdef", b"pickle")))


PLACES = [
    pytest.param(lambda cache: os.chmod(cache.parent, 0o777), "mode 777, open to group or others: chmod 755", id="folder-others-writable"),
    pytest.param(lambda cache: os.chmod(cache.parent, 0o775), "mode 775, open to group or others: chmod 755", id="folder-group-writable"),
    pytest.param(lambda cache: os.chmod(cache, 0o666), "mode 666, open to group or others: chmod 644", id="file-others-writable"),
    pytest.param(lambda cache: os.chown(cache, NOBODY, NOBODY), f"belongs to uid {NOBODY}, not to this user", id="file-of-another-user"),
    pytest.param(lambda cache: os.chown(cache.parent, NOBODY, NOBODY), f"belongs to uid {NOBODY}, not to this user", id="folder-of-another-user"),
]


@pytest.mark.parametrize(("place", "why"), PLACES)
def test_a_signed_cache_that_others_could_write_is_refused(user, place, why):
    """The cache is signed and well formed: only where it lies is wrong."""
    cache = user / "caches" / "cache.bin"
    cache_trust.write_signed(cache, torch_cache(("autotune", "ab/abcdef.best_config", BEST_CONFIG)))
    if "uid" in why and os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    place(cache)
    facts = load(cache)
    assert refused(facts, why), facts
    assert not (user / "inductor" / "ab").exists()


def test_a_link_to_a_signed_cache_is_refused(user):
    cache = user / "caches" / "cache.bin"
    cache_trust.write_signed(cache, torch_cache(("autotune", "ab/abcdef.best_config", BEST_CONFIG)))
    link = user / "caches" / "link.bin"
    link.symlink_to(cache)
    assert refused(load(link), "name the cache file itself, not a link")


def test_a_key_others_can_read_signs_nothing(user):
    cache = user / "caches" / "cache.bin"
    cache_trust.write_signed(cache, torch_cache(("autotune", "ab/abcdef.best_config", BEST_CONFIG)))
    os.chmod(cache_trust.key_path(), 0o644)
    assert refused(load(cache), f"open to group or others: chmod 600 {cache_trust.key_path()}")
    os.chmod(cache_trust.key_path(), 0o600)
    assert load(cache).cache_loaded == {"autotune": 1}
    key = cache_trust.key_path()
    key.rename(user / "key-elsewhere")
    key.symlink_to(user / "key-elsewhere")  # a key that is a link is someone else's choice, refused like the rest
    assert refused(load(cache), "cannot be read (Too many levels of symbolic links): it must be a file of its own, not a link")


def test_a_cache_changed_after_signing_is_refused(user):
    """One byte of an artifact changed, torch's own checksum made right again: torch would take it."""
    cache = user / "caches" / "cache.bin"
    cache_trust.write_signed(cache, torch_cache(("autotune", "ab/abcdef.best_config", BEST_CONFIG)))
    signature, payload = cache.read_bytes().split(b"\n", 1)
    plant(cache, signature + b"\n" + with_torch_checksum(payload.replace(b'"XBLOCK": 64', b'"XBLOCK": 65')))
    assert refused(load(cache), "its signature does not match its bytes"), load(cache)
    assert not (user / "inductor" / "ab").exists()


def test_a_cache_from_another_user_or_machine_is_refused_until_re_signed(user, monkeypatch):
    """Signed with another key (another machine's, another user's); ``cache_trust sign`` re-signs it
    for this user, in a real process, and then it loads."""
    cache = user / "caches" / "cache.bin"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user / "elsewhere"))
    cache_trust.write_signed(cache, torch_cache(("autotune", "ab/abcdef.best_config", BEST_CONFIG)))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user / "config"))
    cache_trust.write_signed(user / "caches" / "own.bin", torch_cache(("autotune", "cd/cdef.best_config", BEST_CONFIG)))  # this user has a key
    assert refused(load(cache), "from another machine or user): delete it, or vet it and re-sign it")
    env = clean_env(XDG_CONFIG_HOME=str(user / "config"))
    done = subprocess.run([sys.executable, "-m", "scalerepro.training.cache_trust", "sign", str(cache)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(f"signed {cache} with"), done.stderr
    assert load(cache).cache_loaded == {"autotune": 1}


def test_sign_refuses_a_cache_whose_keys_leave_torchs_folder_in_one_line(user):
    cache = user / "planted.bin"
    planted = torch_cache(("autotune", str(user / "outside" / "sitecustomize.py"), b"import os\n"))
    plant(cache, planted)
    env = clean_env(XDG_CONFIG_HOME=str(user / "config"))
    done = subprocess.run([sys.executable, "-m", "scalerepro.training.cache_trust", "sign", str(cache)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "names a path outside torch's cache folder" in done.stderr, done.stderr
    assert cache.read_bytes() == planted


def test_a_signed_file_torch_cannot_read_is_named_in_one_line(user, caplog):
    writer = BytesWriter()  # torch's container, holding a kind of artifact this torch does not know
    writer.write_uint64(1)
    writer.write_str("nonesuch")
    writer.write_uint64(1)
    writer.write_str("key")
    writer.write_bytes(b"content")
    cache = user / "caches" / "cache.bin"
    cache_trust.write_signed(cache, writer.to_bytes())
    facts = load(cache)
    assert facts.cache_loaded is None and facts.cache_reason == f"{cache} could not be loaded (not a cache file of this torch): compiled cold"
    assert not [entry for entry in caplog.records if entry.name.startswith("torch")]  # torch's traceback is not in the log
    plant(cache, b"\0" * 20)
    assert refused(load(cache), "it is not signed by a scalerepro run")


@pytest.mark.slow
def test_compiled_runs_past_a_planted_cache_and_under_an_aten_cap_each_compile_into_a_cache_of_their_own(tmp_path):
    """Two real compiled runs sharing torch's default kernel folder (in TMPDIR), as two studies on
    one machine do. The first is given a planted cache: nothing lands outside torch's folder, the
    record and the log name the refusal in one line, and the run writes its own signed cache over
    it. The second runs under ATEN_CPU_CAPABILITY=avx2: torch 2.13's inductor reused a CPU kernel
    compiled without the cap (its key leaves the cap out), and the compiled CNN's step failed on an
    index of -4.8e18; it compiles into a folder of the cap's own."""
    outside = tmp_path / "outside"
    cache = tmp_path / "caches" / "cache.bin"
    plant(cache, torch_cache(("autotune", str(outside / "sitecustomize.py"), b"import os\n")))
    env = clean_env(TMPDIR=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env = {name: value for name, value in env.items() if name not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    args = ["--model", "cnn", "--device", "cpu", "--per-gpu-batch", "8", "--steps", "4", "--warmup-steps", "2", "--synthetic-samples", "64", "--no-eval"]
    args += ["--comm-probe-steps", "0", "--bucket-probe-steps", "0", "--compile", "default"]
    native = python_train([*args, "--compile-cache", str(cache), "--record", str(tmp_path / "native.json")], env=env)
    assert native.returncode == 0, native.stderr[-2000:]
    reason = load_record(tmp_path / "native.json")["measurements"]["compile"]["cache_reason"]
    assert reason.startswith(f"{cache} could not be loaded (it is not signed by a scalerepro run") and reason.endswith(": compiled cold"), reason
    assert f"compile cache: {reason}\n" in native.stdout + native.stderr
    assert not outside.exists()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        cache_trust.verified_payload(cache)  # the run's own cache, signed with this user's key
    capped = python_train([*args, "--record", str(tmp_path / "capped.json")], env={**env, "ATEN_CPU_CAPABILITY": "avx2"})
    assert capped.returncode == 0, capped.stderr[-2000:]
    assert load_record(tmp_path / "capped.json")["knobs"]["compile"] == "default"
    folders = sorted(path.name for path in tmp_path.glob("torchinductor_*"))
    assert len(folders) == 2 and folders[1] == f"{folders[0]}-aten-avx2", folders


# ---- torch's own kernel cache folder (TORCHINDUCTOR_CACHE_DIR) --------------------------------


@pytest.mark.parametrize(
    ("plant_folder", "said"),
    [
        pytest.param(lambda folder: (folder.mkdir(), os.chown(folder, NOBODY, NOBODY)), f"belongs to uid {NOBODY}", id="made-first-by-another-user"),
        pytest.param(lambda folder: (folder.mkdir(), os.chmod(folder, 0o777)), "has mode 777, open to group or others", id="open-to-others"),
        pytest.param(lambda folder: folder.write_bytes(b"not a folder"), "is not a folder", id="a-file"),
    ],
)
def test_a_kernel_cache_folder_another_user_could_fill_is_never_used(plant_folder, said, tmp_path, monkeypatch, capsys):
    """Inductor's default cache is /tmp/torchinductor_<user>, a name any user of a shared node can
    make first; torch loads the pickles and libraries it finds there and checks no owner. A run
    compiles into a new private folder instead, and its log says why."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    environ: dict[str, str] = {}
    planted = Path(private_compile_cache(dict(environ)))  # torch's default, which torch's import may already have made
    planted.rmdir()
    assert private_compile_cache(dict(environ)) == str(planted) and planted.stat().st_mode & 0o777 == 0o700  # absent: made 0700
    assert capsys.readouterr().err == ""
    planted.rmdir()
    plant_folder(planted)
    used = Path(private_compile_cache(environ))
    assert used != planted and environ["TORCHINDUCTOR_CACHE_DIR"] == str(used) and used.stat().st_mode & 0o777 == 0o700
    err = capsys.readouterr().err
    assert f"torch.compile's cache is not used ({planted}" in err and said in err and str(used) in err
