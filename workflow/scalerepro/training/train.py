"""Entry point: ``torchrun --nproc-per-node N -m scalerepro.training.train ...`` or plain ``python -m scalerepro.training.train``.

Exit codes: 0 done; 1 the run failed (record status "failed"); 2 bad flags, config or dataset;
75 stopped by SIGTERM/SIGUSR1 after checkpointing (EX_TEMPFAIL: run again with --resume).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import traceback
import uuid
from typing import TYPE_CHECKING, TypedDict

import torch.distributed

from scalerepro.common import host_heap
from scalerepro.common.cli import error_boundary
from scalerepro.common.exits import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE
from scalerepro.common.files import utc_now
from scalerepro.data import cifar10
from scalerepro.trainer_flags import TrainConfig, TrainerConfigError, given_flags, parse_args, with_device
from scalerepro.training import distributed, record, run_setup
from scalerepro.training.distributed import DistContext, DistributedSetupError
from scalerepro.training.stop_request import StopRequest
from scalerepro.training.trainer import NonFiniteLossError, Trainer

if TYPE_CHECKING:
    from typing_extensions import Unpack

_USAGE_ERRORS = (TrainerConfigError, cifar10.DatasetError)
_KNOWN_ERRORS = (*_USAGE_ERRORS, DistributedSetupError, NonFiniteLossError)


class _RunIdentity(TypedDict):
    """The arguments of record.build that every record of the run shares."""

    run_id: str
    started_at: str
    argv: list[str]


class EmptyWindowError(RuntimeError):
    """The run ended without a single measured step."""


def _silent(*args: object, **kwargs: object) -> None:
    pass


def _is_peer_failure(error: BaseException) -> bool:
    """A collective failed because a peer went away (gloo reports it as a plain RuntimeError)."""
    markers = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "communicator was aborted")
    return isinstance(error, torch.distributed.DistBackendError) or any(m in str(error) for m in markers)


def _fail(config: TrainConfig, ctx: DistContext | None, trainer: Trainer | None, error: BaseException, **common: Unpack[_RunIdentity]) -> int:
    rank = ctx.rank if ctx is not None else 0
    step = trainer.progress.step if trainer is not None else None
    where = f"rank {rank}" + (f" at step {step}" if step is not None else "")
    if isinstance(error, _KNOWN_ERRORS):
        detail = str(error)
    elif ctx is not None and ctx.distributed and _is_peer_failure(error):
        first_line = str(error).strip().splitlines()[0]
        detail = f"lost contact with another rank, which failed or was killed first: see that rank's log for the cause ({first_line})"
    else:
        detail = f"{type(error).__name__}: {error}"
    print(f"scalerepro.training.train: error: {where}: {detail}", file=sys.stderr, flush=True)
    if config.run.record and rank == 0:
        measurements = None
        if trainer is not None:
            # Other ranks may be gone: reduce nothing, report what this rank measured.
            try:
                measurements = trainer.results(local_only=True)
            except Exception:  # noqa: BLE001 - the failure being reported matters more
                measurements = None
        document = record.build(
            status="failed",
            config=config,
            ctx=ctx,
            trainer=trainer,
            measurements=measurements,
            measurements_scope="rank 0 only" if measurements is not None else None,
            error={
                "type": type(error).__name__,
                "message": f"{where}: {detail}",
                "traceback": "".join(traceback.format_exception(error)),
            },
            **common,
        )
        record.write(config.run.record, document)
    return EXIT_USAGE if isinstance(error, _USAGE_ERRORS) else EXIT_FAILED


@error_boundary("scalerepro.training.train")
def main(argv: list[str]) -> int:
    started_at = utc_now()
    config = parse_args(argv)  # exits 2 with one line on a bad flag
    run_id = config.run.run_id or str(uuid.uuid4())
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, run_id=run_id))
    common: _RunIdentity = {"run_id": run_id, "started_at": started_at, "argv": argv}
    ctx: DistContext | None = None
    trainer: Trainer | None = None
    code = EXIT_FAILED
    stop = StopRequest()
    host_heap.steady_heap()  # before anything is built: every step's allocations then cost alike (the module says why)
    try:
        ctx = distributed.setup(
            config.parallel.device,
            config.parallel.dist_timeout_s,
            group_at_one_rank=config.parallel.process_group_at_one_rank,
            backend=config.parallel.dist_backend,
        )
        log = functools.partial(print, flush=True) if ctx.is_main else _silent
        if config.parallel.device == "auto":  # the preset's precision depends on the device (bf16 on a CPU only where native)
            config = with_device(config, ctx.device.type, given_flags(argv))
        config = run_setup.resolve_config(config, ctx)
        run_setup.set_process_state(config, ctx)
        trainer = Trainer(config, ctx, stop, log=log)
        outcome = trainer.fit()
        measurements = trainer.results()
        error = None
        if outcome.status == "ok" and not measurements.measured_steps:
            # A run that trained but timed nothing is not a result (the standard of truth).
            error = EmptyWindowError(
                f"rank 0: the measured window is empty ({trainer.total_steps} steps, {trainer.warmup.steps} warm-up, "
                f"started at step {trainer.start_step}): raise --steps or lower --warmup-steps"
            )
            if ctx.is_main:
                print(f"scalerepro.training.train: error: {error}", file=sys.stderr, flush=True)
        status = "failed" if error is not None else outcome.status
        if ctx.is_main and config.run.record:
            document = record.build(
                status=status,
                config=config,  # as resolved for this rank (e.g. --num-workers)
                ctx=ctx,
                trainer=trainer,
                measurements=measurements,
                measurements_scope="all ranks",
                stop_signal=outcome.stop_signal,
                checkpoint_path=outcome.checkpoint_path,
                error=None if error is None else {"type": type(error).__name__, "message": str(error), "traceback": ""},
                **common,
            )
            record.write(config.run.record, document)
        if status == "ok":
            trainer.discard_checkpoints()  # only now that the record is on disk
        if error is not None:
            code = EXIT_FAILED
        elif outcome.status == "preempted":
            log(f"stopped by {outcome.stop_signal} at step {trainer.progress.step}; checkpoint {outcome.checkpoint_path}; rerun with --resume")
            code = EXIT_PREEMPTED
        else:
            if measurements.samples_per_s:
                log(f"done: {measurements.samples_per_s:,.1f} samples/s over {measurements.measured_steps} measured steps")
            code = EXIT_OK
    except Exception as error:  # noqa: BLE001 - every failure becomes a record and one line
        code = _fail(config, ctx, trainer, error, **common)
    finally:
        if ctx is not None:
            distributed.finish(ctx, clean=code in (EXIT_OK, EXIT_PREEMPTED))
        stop.restore()
    return code


if __name__ == "__main__":
    distributed.leave(main())
