"""Every record layout the project has written, read into today's model: one chain of steps, each
taking a record of one schema to the next.

A step moves and renames what the next layout keeps elsewhere, and fills what the older trainer
did without saying (a lever that did not exist yet ran as its default did: a fact of that
trainer, not a guess). What an older record cannot hold stays empty: its field is None (or absent
where the model lets it be), and ``Upgraded.absent`` says why, field by field. What an older
trainer is known to have measured wrongly is withheld, with why (``Upgraded.withheld``).

The kept records the chain must read: the H100 sessions' records (schemas 2 and 3,
benchmarks/gpu/), the CPU study and records kept as test fixtures (schemas 2 and 3), the
benchmarks' template (schema 1) and today's trainer's (schemas 4 and 5).
"""

from __future__ import annotations

import functools
import math
import shlex
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from scalerepro.record.model import RECORD_SCHEMA_VERSION, RunRecord
from scalerepro.record.peak import peak_for

OLDEST_RECORD_SCHEMA = 1


@dataclass(frozen=True)
class Withheld:
    """Figures a record holds that its trainer is known to have measured wrongly: the runs table's
    ``columns`` are left empty, with ``why``."""

    columns: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Upgraded:
    """A record's document in today's layout (not yet validated: scalerepro.record.read does), the
    schema it was written in, why each field an older record cannot hold is empty (a dotted path
    -> why), and what it holds wrongly."""

    document: dict[str, Any]
    written_as: int
    absent: Mapping[str, str] = field(default_factory=dict)
    withheld: tuple[Withheld, ...] = ()


@dataclass
class _Step:
    """One record on its way up the chain: the document, and what each step could not fill."""

    document: dict[str, Any]
    absent: dict[str, str] = field(default_factory=dict)
    withheld: list[Withheld] = field(default_factory=list)

    def at(self, *path: str) -> dict[str, Any]:
        """The object at ``path`` (absent or null: an empty one, not added)."""
        value: Any = self.document
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, dict) else {}

    def fill(self, path: tuple[str, ...], key: str, value: Any, why: str | None = None) -> None:
        """Set ``key`` of the object at ``path`` where it is absent; ``why`` says why a None is empty."""
        target = self.at(*path)
        if key in target or not self._exists(path):
            return
        target[key] = value
        if why is not None:
            self.absent[".".join((*path, key))] = why

    def _exists(self, path: tuple[str, ...]) -> bool:
        value: Any = self.document
        for key in path:
            if not isinstance(value, dict) or not isinstance(value.get(key), dict):
                return False
            value = value[key]
        return True


def _before(version: int, what: str) -> str:
    return f"not recorded: {what} entered the record after schema {version}"


def _v1(step: _Step) -> None:
    """1 -> 2: the scheduler's facts under ``scheduler`` (1 had ``slurm``, null outside Slurm)."""
    doc = step.document
    slurm = doc.pop("slurm", None)
    doc["scheduler"] = {"name": "slurm", **slurm} if isinstance(slurm, dict) else {"name": "local", "job_id": None, "cluster_name": None, "partition": None}


def _v2(step: _Step) -> None:
    """2 -> 3: the micro-batch is ``batch.per_gpu`` (2 named it ``per_rank``)."""
    batch = step.at("batch")
    if "per_rank" in batch:
        batch["per_gpu"] = batch.pop("per_rank")


# The record's purpose from a schema-3 command line: flags only a smoke run gives.
def _flag_value(command: list[str], flag: str) -> str | None:
    values = [command[i + 1] for i, word in enumerate(command[:-1]) if word == flag]
    values += [word.split("=", 1)[1] for word in command if word.startswith(flag + "=")]
    return values[-1] if values else None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def purpose_from_command(document: Mapping[str, Any]) -> tuple[str, str]:
    """What a record from before ``purpose`` was for, from its command line, by one rule: a smoke
    run asked for a process group or a profile at one rank (``--process-group-at-one-rank``,
    ``--profile-mode``), or ran the communication or bucket probes at one rank outside a study (no
    ``--run-id``: every study names its runs); every other run was a measurement."""
    command = [str(word) for word in document.get("command_line") or [] if isinstance(word, (str, int, float))]
    if any(word in ("--process-group-at-one-rank", "--profile-mode") or word.startswith("--profile-mode=") for word in command):
        return "smoke", "from its command line (a process group or a profile at one rank)"
    probes = [_number(_flag_value(command, flag)) or 0 for flag in ("--comm-probe-steps", "--bucket-probe-steps")]
    parallel = document.get("parallel")
    one_rank = ((parallel.get("world_size") if isinstance(parallel, dict) else None) or 1) == 1
    if one_rank and any(probes) and _flag_value(command, "--run-id") is None:
        return "smoke", "from its command line (the probes at one rank, outside a study)"
    return "measurement", "from its command line (a record older than the purpose field)"


def _v3(step: _Step) -> None:
    """3 -> 4: the purpose (3's, read from its command line), the clock of the data wait (3's CPU runs: the host's, as a CPU's always is; its
    GPU runs: the host's wait in the fetch, which is withheld below), and NVML's newer figures."""
    doc = step.document
    if "purpose" not in doc:
        doc["purpose"], step.absent["purpose"] = purpose_from_command(doc)
    device = step.at("parallel").get("device_type")
    measurements = step.at("measurements")
    if measurements and "data_wait_clock" not in measurements:
        measurements["data_wait_clock"] = "host" if device == "cpu" else None
        if device == "cuda":
            step.absent["measurements.data_wait_clock"] = _before(3, "the device clock of the data wait")
    for key, what in (
        ("sm_clock_min_mhz", "the lowest SM clock"),
        ("sm_clock_max_supported_mhz", "the card's top SM clock"),
        ("power_limit_w", "the power limit"),
        ("clock_event_reasons", "the clock-event reasons"),
        ("temperature_mean_c", "the mean temperature"),
    ):
        if step.at("measurements", "nvml").get("available"):
            step.fill(("measurements", "nvml"), key, None, _before(3, what))
    if device == "cuda":
        for key, what in (("uuid", "the card's UUID"), ("power_limit_w", "the card's power limit"), ("sm_clock_max_mhz", "the card's top SM clock")):
            step.fill(("hardware", "gpu"), key, None, _before(3, what))


LEVER_DEFAULTS = {"cudnn_benchmark": False, "compile_scope": "model", "attention_backend": "auto", "stem_channels": 3}


def _configured(doc: Mapping[str, Any], section: str, *keys: str) -> Any:
    """The first of ``keys`` the record's config states in ``section`` (the trainer's flags, as it resolved them)."""
    config = doc.get("config")
    values = config.get(section) if isinstance(config, dict) else None
    return next((values[key] for key in keys if isinstance(values, dict) and key in values), None)


def _v4(step: _Step) -> None:
    """4 -> 5: the precision as its dtypes (with 4's ``knobs.precision_reason``); the batch as
    micro-batch, accumulation, samples per GPU a step and global batch, and the model by name,
    also where the run failed before its trainer was built (4 left both null: they are its flags);
    the strategy under ``parallel`` (4 said it in ``measurements.sharding``, null under ddp);
    each fact once (4's ``knobs`` and ``data`` repeated the accumulation and the loader); and the
    MFU peak as facts, not prose: 4 stated a number and its source in words, and the peak of its
    device at its precision, from the table, is those facts where it is the number 4 stated."""
    doc = step.document
    knobs = step.at("knobs")
    # a lever a record does not state ran as its default: before each was a flag, the trainer did
    # not benchmark cuDNN, compiled the whole model, let PyTorch choose the attention kernel and
    # fed the ResNets 3 channels
    for lever, default in LEVER_DEFAULTS.items():
        knobs.setdefault(lever, default)
    precision = doc.get("precision")
    reason = knobs.pop("precision_reason", None)
    knobs.pop("grad_accum_steps", None)
    step.at("data").pop("loader", None)
    step.at("model", "shape").pop("stem_channels", None)
    if precision in ("fp32", "tf32", "fp16", "bf16"):
        doc["precision"] = {
            "name": precision,
            "param_dtype": "fp32",
            "compute_dtype": precision,
            "optimizer_state_dtype": "fp32",
            "loss_scaling": precision == "fp16",
            "reason": reason,
        }
    if doc.get("model") is None:
        doc["model"] = dict.fromkeys(("task", "family", "num_parameters", "tokens_per_sample", "train_flops_per_sample", "flops_source", "shape"))
        doc["model"]["name"] = _configured(doc, "model", "model")
        step.absent["model"] = "the run failed before its model was built"
    batch = doc.get("batch")
    world = step.at("parallel").get("world_size")
    if isinstance(batch, dict) and "per_gpu" in batch:
        total = batch.get("global")
        doc["batch"] = {
            "micro_batch": batch["per_gpu"],
            "grad_accum_steps": batch["grad_accum_steps"],
            # samples per GPU a step = global batch / world size
            "samples_per_gpu_step": total / world if isinstance(total, int) and isinstance(world, int) and world > 0 else None,
            "global_batch": total,
        }
    elif batch is None:
        doc["batch"] = {
            "micro_batch": _configured(doc, "run", "per_gpu_batch", "batch_size"),
            "grad_accum_steps": _configured(doc, "optim", "grad_accum_steps") or 1,
            "samples_per_gpu_step": None,
            "global_batch": None,
        }
        step.absent["batch.global_batch"] = "the run failed before its ranks formed"
    measurements = doc.get("measurements")
    sharding = measurements.get("sharding") if isinstance(measurements, dict) else None
    if isinstance(sharding, dict):
        strategy = sharding.pop("strategy", None)
    elif isinstance(measurements, dict) and "sharding" in measurements:
        strategy = "ddp"  # null sharding: ddp
    else:
        strategy = _configured(doc, "parallel", "parallel") or "ddp"  # schema 1's trainer had DDP alone
    if isinstance(doc.get("parallel"), dict):
        doc["parallel"]["strategy"] = strategy
    if isinstance(measurements, dict):
        stated, source = measurements.pop("peak_flops_per_device", None), measurements.pop("peak_flops_source", None)
        measurements["peak"], measurements["peak_reason"] = _stated_peak(doc, stated, source)


def _stated_peak(doc: Mapping[str, Any], stated: Any, source: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The structured peak of a record that stated ``stated`` FLOP/s from ``source`` (words): the
    table's peak of its device at its precision where that is the number stated; else the number
    with its words, no part and no clock (a peak the table does not give)."""
    if not isinstance(stated, (int, float)) or isinstance(stated, bool):
        return None, source if isinstance(source, str) else None
    precision = doc.get("precision")
    name = precision.get("name") if isinstance(precision, dict) else None
    hardware = doc.get("hardware")
    card = hardware.get("gpu") if isinstance(hardware, dict) else None
    gpu = card.get("name") if isinstance(card, dict) else None
    override = _configured(doc, "run", "peak_tflops")
    peak, _ = peak_for(gpu, name, override) if name in ("fp32", "tf32", "fp16", "bf16") else (None, None)
    if peak is not None and math.isclose(peak.flops_per_s, stated, rel_tol=1e-9):
        return {**peak.model_dump(), "source": source if isinstance(source, str) else peak.source}, None
    arithmetic = {"fp32": ("fp32", "cuda_core")}.get(str(name), (name, "tensor"))
    return {
        "flops_per_s": stated,
        "precision": arithmetic[0],
        "units": arithmetic[1],
        "clock_mhz": None,
        "part": None,
        "mig_profile": None,
        "mig_slices": None,
        "form_factor_assumed": False,
        "basis": "user override" if isinstance(source, str) and source.startswith("user override") else "table",
        "source": source if isinstance(source, str) else "not stated",
    }, None


def _v5(step: _Step) -> None:
    """5 -> 6: nothing moves; 6 adds the temperature and SM clock at each end of the window, which
    a schema-5 record does not have (each reads "not recorded")."""


STEPS: dict[int, Callable[[_Step], None]] = {1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5}
assert sorted(STEPS) == list(range(OLDEST_RECORD_SCHEMA, RECORD_SCHEMA_VERSION))

# What an older trainer measured wrongly, by the schema that fixed it: the runs table's columns withheld.
KNOWN_DEFECTS: dict[int, tuple[Callable[[Mapping[str, Any]], bool], Withheld]] = {
    3: (
        lambda document: True,
        Withheld(
            ("peak_memory_bytes", "activations_bytes_per_rank"),
            "the peak of a schema-2 record may include the probes run after the measured window (the trainer reads the window's own peak from schema 3 on)",
        ),
    ),
    4: (
        lambda document: (document.get("parallel") or {}).get("device_type") == "cuda" and not (document.get("measurements") or {}).get("data_wait_clock"),
        Withheld(
            ("data_stall_fraction", "data_wait_s", "window_data_wait_rank_mean_s"),
            "on a GPU, a record that does not name the clock of its data wait (before schema 4) holds the host's wait in "
            "the fetch, which counts a host that runs ahead of the GPU and blocks there (no stall); the trainer reads it "
            "on the device clock from schema 4",
        ),
    ),
}


def _objects_copied(value: Any) -> Any:
    """A JSON document with each of its objects copied (the steps change objects, never a list),
    its lists (a long loss log) shared."""
    return {key: _objects_copied(item) for key, item in value.items()} if isinstance(value, dict) else value


@functools.cache
def _fields(model: type[BaseModel]) -> tuple[tuple[str, bool, type[BaseModel] | None], ...]:
    """Each field of ``model``: its name, whether a record must state it, and the part it holds (None: a value)."""
    found = []
    for name, info in model.model_fields.items():
        parts = [arg for arg in typing.get_args(info.annotation) or (info.annotation,) if isinstance(arg, type) and issubclass(arg, BaseModel)]
        found.append((name, info.is_required(), parts[0] if parts else None))
    return tuple(found)


def _unstated(document: dict[str, Any], model: type[BaseModel], prefix: str = "") -> list[str]:
    """Each field the model lets a record leave out that ``document`` leaves out, dotted."""
    found = []
    for name, required, part in _fields(model):
        if name not in document:
            found += [] if required else [f"{prefix}{name}"]
        elif part is not None and isinstance(document[name], dict):
            found += _unstated(document[name], part, f"{prefix}{name}.")
    return found


def upgraded(document: dict[str, Any]) -> Upgraded:
    """``document``, a record of any schema the chain knows (``schema_version`` checked by the
    caller: scalerepro.record.read), in today's layout: itself where it is today's, else a copy
    taken up the chain. KeyError, TypeError or AttributeError where an older document is too
    damaged to take up the chain."""
    written_as = document["schema_version"]
    if written_as == RECORD_SCHEMA_VERSION:  # no step to take; what it leaves out, its writer left out
        return Upgraded(document, written_as)
    step = _Step(_objects_copied(document))
    for version in range(written_as, RECORD_SCHEMA_VERSION):
        fixed_in = KNOWN_DEFECTS.get(version + 1)
        if fixed_in is not None and fixed_in[0](step.document):
            step.withheld.append(fixed_in[1])
        STEPS[version](step)
        step.document["schema_version"] = version + 1
    unstated = {path: f"not recorded: a schema-{written_as} record has no {path}" for path in _unstated(step.document, RunRecord)}
    return Upgraded(step.document, written_as, {**unstated, **step.absent}, tuple(step.withheld))


# --- a record's command line as today's trainer reads it -----------------------------------------

# The trainer's module and flags under their older names, each with today's: the older trainers'
# command lines run today with these swapped, one for one.
RENAMED_MODULES = {"scalerepro.train": "scalerepro.training.train"}
RENAMED_FLAGS = {"--batch-size": "--per-gpu-batch"}


def _machine_free(word: str) -> str:
    """A word of a command line without the machine it ran on: an absolute path (an interpreter,
    a home directory, /tmp, a site's file system) is cut to its file name."""
    flag, equals, value = word.partition("=") if word.startswith("--") else ("", "", word)
    if value.startswith(("/", "~")):
        value = value.rstrip("/").rsplit("/", 1)[-1]
    return f"{flag}{equals}{value}"


def _renamed(word: str) -> str:
    """``word`` with a flag's older name swapped for today's (``--batch-size=8`` too)."""
    flag, equals, value = word.partition("=")
    return RENAMED_FLAGS.get(flag, flag) + equals + value


def rerun_command(command_line: list[str]) -> str:
    """How a record's run is rerun with today's code: ``python -m`` today's module (RENAMED_MODULES)
    with the record's arguments, each renamed flag swapped for today's (RENAMED_FLAGS) and every
    machine path cut to its file name; a command that is no ``python -m`` is shown commented out
    as not runnable."""
    words = [str(word) for word in command_line]
    if "-m" not in words[:-1]:
        return f"# not runnable with today's code (not a python -m command): {shlex.join(map(_machine_free, words))}"
    module = words[words.index("-m") + 1]
    arguments = [_renamed(word) for word in words[words.index("-m") + 2 :]]
    command = shlex.join(["python", "-m", RENAMED_MODULES.get(module, module), *map(_machine_free, arguments)])
    renamed = [f"{old} → {new}" for old, new in (*RENAMED_MODULES.items(), *RENAMED_FLAGS.items()) if old in (module, *(w.partition("=")[0] for w in words))]
    return command + (f"  # today's names: {', '.join(renamed)}" if renamed else "")
