"""The training loop: build everything from a TrainConfig, train for a measured window, hand its figures over.

The Trainer takes its config resolved and the process state set (``run_setup``, called by the
entry point ``train.main``), and keeps the config as it was given.

Reading order: ``Trainer.__init__`` (model, data, optimizer, DDP, profiling, resume), ``fit``
and ``_train`` (the loop), ``_timed_step`` and ``train_step`` (one optimizer step of
``grad_accum_steps`` micro-batches), ``probe_step`` (the same step as the probes after training
take it), ``_log_point``, ``_finish_epoch``, the checkpoints, ``results``.

Like torchtitan's trainer, the loop hands its other jobs to modules of their own, each given
what it needs and never the trainer: ``progress`` (the run's position, the running loss, the
bar), ``evaluation``, ``run_state`` (the run's state in and out of checkpoints),
``energy_window``, ``probes`` (handed the step function) and ``measurements`` (what the rank
measured, reduced into the record's figures).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from scalerepro.data import builders, sources
from scalerepro.models import registry
from scalerepro.parallel import mesh, parallelize
from scalerepro.telemetry import metrics, ranges
from scalerepro.trainer_flags import TrainConfig, TrainerConfigError
from scalerepro.training import (
    allreduce_timing,
    buckets,
    compilation,
    distributed,
    evaluation,
    kernel_profile,
    measured_window,
    measurements,
    optim,
    parallel_form,
    probes,
    run_setup,
    run_state,
)
from scalerepro.training.distributed import DistContext, all_reduce_max, all_reduce_sum
from scalerepro.training.energy_window import EnergyWindow
from scalerepro.training.measured_window import Warmup
from scalerepro.training.objective import ModelWithLoss
from scalerepro.training.progress import Progress, ProgressBar, RunningLoss, progress_bar
from scalerepro.training.stop_request import StopRequest

DEFAULT_STEPS = 100


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class Outcome:
    status: str  # "ok" | "preempted"
    stop_signal: str | None = None
    checkpoint_path: str | None = None


class Trainer:
    _energy: EnergyWindow | None = None  # the measured window's energy sampling (fit), paused outside training steps

    def __init__(self, config: TrainConfig, ctx: DistContext, stop: StopRequest, log: Any = print):
        """``config`` comes resolved (run_setup.resolve_config) and the process state set
        (run_setup.set_process_state): the trainer keeps ``config`` as it was given."""
        if not run_setup.is_resolved(config):
            raise ValueError("the Trainer takes a resolved config: pass it through run_setup.resolve_config first")
        self.config, self.ctx, self.stop, self.log = config, ctx, stop, log
        self.device = ctx.device
        self.spec = run_setup.resolve_model(config)
        self._build_data()
        self._build_model()
        self._build_optimizer()
        self._wrap_model()
        self._set_up_profiling()
        self._open_checkpoints()
        self.start_step = self.progress.step  # this process's first step (warm-up counts from here)
        self.warmup = Warmup(config.run)  # this process's: --warmup-steps, or more until the step time settles
        # Measurements of this process's segment of the run (scalerepro.training.measurements).
        self.measured = measurements.RankMeasurements.before_training(self.device, config.run.nvml_interval_s, self.compile_facts)
        # DDP's all-reduce with each bucket's launch and completion marked on the step timer's clock
        # (in a named range when profiling): the window's steps split into compute and waits
        self.allreduce_timing, self.measured.window_split_reason = allreduce_timing.install(
            self.ddp, self.measured.timer, self.device, config.perf.compile, config.profile.profile_mode != "none"
        )
        self.loss_log: list[dict[str, float]] = []

    # ---- construction helpers -------------------------------------------------------------

    def _build_data(self) -> None:
        """The data sources, this rank's loader and the run's length in steps."""
        config, run = self.config, self.config.run
        place = run_setup.data_parallel_place(config, self.ctx)
        self.tp_size, self.dp_rank, self.dp_size = place.tp_size, place.dp_rank, place.dp_size
        self.train_source, self.eval_source = builders.make_sources(config.data, self.spec, run.seed)
        self.global_batch = mesh.global_batch(run.per_gpu_batch, config.optim.grad_accum_steps, self.dp_size)
        self.loader = builders.make_train_loader(
            config.data,
            self.train_source,
            run.per_gpu_batch,
            self.dp_size,
            self.dp_rank,
            run.seed,
            self.device,
            self._channels_last,
        )
        self.steps_per_epoch = self.loader.micro_batches_per_epoch // config.optim.grad_accum_steps
        if self.steps_per_epoch < 1:
            raise TrainerConfigError(
                f"an epoch of {self.train_source.num_samples} samples over {self.ctx.world_size} ranks gives no full step of "
                f"{run.per_gpu_batch} x {config.optim.grad_accum_steps}: lower --per-gpu-batch or raise --synthetic-samples"
            )
        self.total_steps = run.epochs * self.steps_per_epoch if run.epochs else (run.steps or DEFAULT_STEPS)
        # the LR schedule's length; total_steps grows past it when --min-window-s asks for more
        self.scheduled_steps = self.total_steps
        if max(run.warmup_steps, run.warmup_max_steps) >= self.total_steps:
            flag = "--warmup-max-steps" if run.warmup_max_steps > run.warmup_steps else "--warmup-steps"
            raise TrainerConfigError(f"{flag} ({max(run.warmup_steps, run.warmup_max_steps)}) must be smaller than the run's {self.total_steps} steps")

    def _build_model(self) -> None:
        """The model on the device; a sharded form (--parallel, scalerepro.parallel) replaces the
        parameters, so it comes before the optimizer is built (DDP wraps the model later)."""
        with torch.device("cpu"):
            module = registry.build(self.spec)
        if self.config.parallel.sync_batchnorm and self.ctx.distributed:
            module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
        self.module = module.to(self.device, memory_format=torch.channels_last if self._channels_last else torch.preserve_format)  # type: ignore[call-overload]  # Module.to takes memory_format; its overloads leave it out
        form = parallel_form.apply(self.module, self.config, self.ctx, self.device, self.tp_size)
        self.module, self.mesh, self.pipeline = form.module, form.mesh, form.pipeline

    def _build_optimizer(self) -> None:
        """Optimizer, LR schedule, the autocast dtype and the loss scaler."""
        config, perf = self.config, self.config.perf
        self.optim_resolved = optim.resolve(config.optim, self.spec.family, self.global_batch)
        self.optimizer = optim.build_optimizer(self.module, config.optim, self.optim_resolved)
        self.scheduler = optim.build_scheduler(self.optimizer, config.optim, self.optim_resolved, self.total_steps)
        self.autocast_dtype = run_setup.autocast_dtype(perf.precision)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=perf.precision == "fp16")
        # what a step changes and a checkpoint holds (scalerepro.training.run_state)
        self.state = run_state.RunState(self.module, self.optimizer, self.scheduler, self.scaler)

    def _wrap_model(self) -> None:
        """DDP, then compile the wrapped model (Dynamo's DDPOptimizer splits the graph at bucket
        boundaries so all-reduce still overlaps backward), or its blocks (scalerepro.training.compilation).
        Both wrap the model with its loss (scalerepro.training.objective): the loss is compiled with it."""
        p, perf = self.config.parallel, self.config.perf
        self.compile_facts = compilation.set_up(perf, self.module, self.spec.name, self.device.type, self.log)
        self.ddp: DistributedDataParallel | None = None
        model: torch.nn.Module = ModelWithLoss(self.module, self.config.optim.label_smoothing)
        if self.ctx.distributed and self.mesh is None:
            self.ddp = DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=p.bucket_cap_mb,
                gradient_as_bucket_view=p.gradient_as_bucket_view,
                static_graph=p.static_graph,
            )
            model = self.ddp
        # model(inputs, targets) -> mean loss. eager_model is the same without compilation: the
        # bucket probe times it (a compiled backward fires every gradient hook at its end).
        self.eager_model = compilation.run_eagerly(model)  # under --compile-scope blocks the compiled blocks are inside it
        self.model = compilation.compile_model(model, self.module, perf)

    def _set_up_profiling(self) -> None:
        """--profile-mode's window (run_setup.set_process_state turned its ranges on); with the
        default "none" nothing is recorded."""
        prof = self.config.profile
        if prof.profile_mode == "cuda_api" and self.device.type != "cuda":
            raise TrainerConfigError(
                f"--profile-mode cuda_api drives the CUDA profiler API for Nsight, and this run is on the {self.device.type}: "
                "use --profile-mode torch (the torch.profiler fallback) there"
            )
        self.profile_window = ranges.ProfileWindow(
            prof.profile_mode,
            prof.profile_window_start,
            prof.profile_window_steps,
            Path(prof.profile_dir) if prof.profile_dir else None,
            self.device,
            self.ctx.is_main,
        )
        if prof.profile_mode != "none" and self.profile_window.end > self.total_steps:
            raise TrainerConfigError(
                f"the profiling window (steps {prof.profile_window_start}..{self.profile_window.end - 1}) ends after the "
                f"run's {self.total_steps} steps: raise --steps or lower --profile-window-start/--profile-window-steps"
            )

    def _open_checkpoints(self) -> None:
        """The run's checkpoint store (--checkpoint-dir), and the progress to continue from (--resume)."""
        run = self.config.run
        self.progress = Progress()
        self.resumed_from: str | None = None
        self._checkpoint_path: str | None = None
        self.checkpoints = (
            run_state.open_store(Path(run.checkpoint_dir), self._fingerprint(), run.keep_checkpoints, sharded=self.mesh is not None)
            if run.checkpoint_dir
            else None
        )
        if run.resume and self.checkpoints is not None:
            self._resume()

    # ---- construction helpers -------------------------------------------------------------

    @property
    def _channels_last(self) -> bool:
        return self.config.perf.channels_last and self.spec.task == "image_classification"

    def _fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must share with this run to continue it exactly (run_state.fingerprint);
        a DTensor-sharded checkpoint (fsdp, tp, fsdp+tp, not pp) continues on another world size."""
        reshardable = self.mesh is not None and self.pipeline is None
        return run_state.fingerprint(self.config, self.ctx.world_size, self.total_steps, self.global_batch, reshardable)

    def _resume(self) -> None:
        """Continue from the newest usable checkpoint, if any (run_state.resume names every
        newer one passed over)."""
        last_resumable = self.total_steps - self.config.run.warmup_steps - 1
        assert self.checkpoints is not None  # _open_checkpoints resumes only where there is a store
        resumed = run_state.resume(self.checkpoints, self.state, self.ctx, last_resumable, self.mesh is not None, self.log)
        if resumed is not None:
            saved_progress, self.resumed_from = resumed
            self.progress = Progress(**saved_progress)

    # ---- the loop ----------------------------------------------------------------------------

    def _forward_context(self) -> contextlib.AbstractContextManager:
        return compilation.forward_context(self.device, self.autocast_dtype, self.config.perf.attention_backend)

    def _next_micro_batch(self, micro_batches: Iterator[sources.Batch]) -> sources.Batch:
        waited = self.measured.timer.data_wait_started()
        with ranges.annotate("data"):
            batch = next(micro_batches)
        self.measured.timer.data_wait_ended(waited)  # the step's own: window_stats sums the measured ones
        return batch

    def _optimizer_step(self) -> None:
        with ranges.annotate("optimizer"):
            if self.config.optim.clip_grad_norm > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.config.optim.clip_grad_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.measured.state_bytes is None:  # once: the sizes are the same every step (host-only arithmetic, no sync)
                self.measured.state_bytes = parallelize.local_state_bytes(self.module, self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, micro_batches: Iterator[sources.Batch], step_scheduler: bool = True) -> torch.Tensor:
        """One optimizer step over grad_accum_steps micro-batches; returns the mean loss (on device).

        DDP all-reduces gradients during the backward of the last micro-batch only: the others
        run under ``no_sync`` and accumulate locally. ``step_scheduler=False`` past the schedule's
        end (--min-window-s's extra steps: OneCycleLR refuses steps past it)."""
        accum = self.config.optim.grad_accum_steps
        total = torch.zeros((), device=self.device)
        for micro in range(accum):
            inputs, targets = self._next_micro_batch(micro_batches)
            if self.pipeline is not None:  # --parallel pp: the schedule runs forward and backward of all
                # --microbatches (accumulation is refused under pp: one loader batch per step)
                (tokens,) = inputs  # pp splits GPT (pipeline_parallel.build_pipeline), whose one input is the tokens
                with self._forward_context(), ranges.annotate("pipeline"):
                    total += self.pipeline.step(tokens, targets)  # the loss, broadcast from the last stage
                continue
            with self.ddp.no_sync() if self.ddp is not None and micro < accum - 1 else contextlib.nullcontext():
                with self._forward_context(), ranges.annotate("forward"):
                    loss = self.model(inputs, targets) / accum
                total += loss.detach()
                with ranges.annotate("backward"):
                    self.scaler.scale(loss).backward()
        self._optimizer_step()
        if step_scheduler:
            self.scheduler.step()
        return total

    def probe_step(
        self, micro_batches: Iterator[sources.Batch], *, sync_gradients: bool, eager: bool = False, marks: buckets.PhaseRecorder | None = None
    ) -> torch.Tensor:
        """``train_step`` as the probes after training take it (probes.StepFunction): the same
        forward, backward and optimizer step, with ``sync_gradients=False`` running no all-reduce
        on any micro-batch, ``eager`` the uncompiled model (see scalerepro.training.buckets), and
        ``marks`` told when each phase is done (device-clock marks: no host synchronisation). It
        leaves the LR scheduler alone (OneCycleLR refuses steps past the run's end); no probe runs
        under a sharded model, so there is no pipeline here."""
        accum = self.config.optim.grad_accum_steps
        model = self.eager_model if eager else self.model
        total = torch.zeros((), device=self.device)
        for micro in range(accum):
            inputs, targets = self._next_micro_batch(micro_batches)
            if marks is not None:
                marks.micro_batch_started()
            skip_sync = not sync_gradients or micro < accum - 1
            with self.ddp.no_sync() if self.ddp is not None and skip_sync else contextlib.nullcontext():
                with self._forward_context(), ranges.annotate("forward"):
                    loss = model(inputs, targets) / accum
                total += loss.detach()
                if marks is not None:
                    marks.forward_done()
                with ranges.annotate("backward"):
                    self.scaler.scale(loss).backward()
                if marks is not None:
                    marks.backward_done()
        self._optimizer_step()
        if marks is not None:
            marks.optimizer_done()
        return total

    def fit(self) -> Outcome:
        """Train from ``self.progress`` to the run's last step or a stop signal; a finished run then probes
        what the scaling analysis needs (exposed comm, buckets) after the window: no timed step carries a hook."""
        run = self.config.run
        try:
            with self._energy_window() as energy, progress_bar(run.progress, self.ctx.is_main, self.total_steps, self.progress.step, self.log) as bar:
                outcome = self._train(energy, bar)
            if outcome.status == "ok":
                probes_started, probed = time.perf_counter(), self.probed_run()
                sizes, self.measured.probe_budget = probes.sized_for_run(run, self.measured.timer, self.ctx, self.ddp is not None)
                # a stop in a probe ends it within a few of its steps (probes); the run is then preempted
                measured_by = {
                    "exposed_comm": lambda: probes.exposed_communication(probed, sizes.comm_steps),
                    "bucket_profile": lambda: probes.backward_buckets(probed, sizes.bucket_steps),
                    "step_kernels": lambda: kernel_profile.profile_steps(probed, run.kernel_profile_steps),
                }
                for field_name, probe in measured_by.items():
                    setattr(self.measured, field_name, probe())
                    stop_signal = self._agreed_stop_signal()
                    if stop_signal is not None:
                        return self._stopped_after_training(stop_signal, "the probes")
                self.measured.probes_s = time.perf_counter() - probes_started
            if self.ctx.is_main:  # after the probes and evaluation: every program the run compiled
                compilation.save_cache(self.compile_facts)
            return outcome
        finally:
            self.loader.close()

    def _train(self, energy: EnergyWindow, bar: ProgressBar) -> Outcome:
        """The training loop: epochs of steps, a log point every ``--log-interval`` steps, a
        checkpoint every ``--checkpoint-interval`` steps or on a stop signal."""
        run, p = self.config.run, self.progress
        micro_per_epoch = self.steps_per_epoch * self.config.optim.grad_accum_steps
        # a resumed epoch continues its global loss sum (held by rank 0 alone: summed over ranks)
        losses = RunningLoss(self.device, p.epoch_loss_sum if self.ctx.is_main else 0.0)
        while p.step < self.total_steps:
            batches = self.loader.epoch(p.epoch, start=p.micro_in_epoch)
            while p.micro_in_epoch < micro_per_epoch and p.step < self.total_steps:
                # Each process warms up anew, a resumed one too: compilation happens per process.
                measured = self.warmup.measured(p.step - self.start_step, self.measured.timer, self.ctx)
                if measured:
                    energy.start()  # at the first measured step; a no-op after
                self._timed_step(batches, measured, losses)
                if p.step % run.log_interval == 0 or p.step == self.total_steps:
                    stop_signal = self._log_point(p, losses, bar)
                    if p.step == self.total_steps and stop_signal is None:
                        self._extend_to_min_window()
                else:
                    stop_signal = self._stop_signal_between_log_points()
                self.profile_window.after_step(p.step - 1)  # the step just taken
                if measured:
                    self.measured.measured_samples += self.global_batch
                bar.update()
                if stop_signal is not None:
                    self._checkpoint_mid_run(losses)
                    return Outcome("preempted", stop_signal, self._checkpoint_path)
                if self.checkpoints is not None and run.checkpoint_interval and p.step % run.checkpoint_interval == 0:
                    self._checkpoint_mid_run(losses)
            if p.micro_in_epoch >= micro_per_epoch:
                self._finish_epoch(p, self._global_sum(losses.epoch), complete=True)
                losses.epoch.zero_()
        energy.stop()  # the energy window ends with the last step, before evaluation
        if run.eval and (not p.history or p.history[-1]["step"] != p.step):
            # A run counted in steps usually ends inside an epoch: evaluate there too.
            self._finish_epoch(p, self._global_sum(losses.epoch), complete=False)
            stop_signal = self._agreed_stop_signal()  # one that came during the evaluation
            if stop_signal is not None:
                return self._stopped_after_training(stop_signal, "the final evaluation")
        # A finished run needs no checkpoint to continue: the final one is written only on
        # request, marked final so that no rerun resumes from it (checkpoint_store.unusable_reason).
        p.epoch_loss_sum = self._global_sum(losses.epoch)
        self._checkpoint_path = None
        if run.keep_final_checkpoint:
            self._save_checkpoint(final=True)
        return Outcome("ok", None, self._checkpoint_path)

    def _timed_step(self, batches: Iterator[sources.Batch], measured: bool, losses: RunningLoss) -> None:
        """One training step between the step timer's marks, and the progress it makes. The
        step's bookkeeping stays on the device (no host synchronisation inside a step)."""
        p = self.progress
        self.profile_window.before_step(p.step)
        started = time.perf_counter()
        self.measured.timer.start()
        with ranges.annotate("step"):
            # past the schedule's end (--min-window-s) the LR stays at its last value: a cosine
            # scheduler stepped past T_max climbs again, OneCycleLR refuses
            loss = self.train_step(batches, step_scheduler=p.step < self.scheduled_steps)
        if p.step == self.start_step:  # where the compile happens: a warm-up step, never measured
            self.compile_facts.first_step_s = compilation.seconds_to_device_end(started, self.device)
        losses.add(loss, p.step)
        p.step += 1
        if p.step == self.start_step + max(self.warmup.steps, 1):
            # Warmed up (the first step a process runs compiles, a resumed one's too): collectives
            # get the steady-state timeout.
            distributed.set_collective_timeout(self.ctx, self.config.parallel.dist_timeout_s)
        p.micro_in_epoch += self.config.optim.grad_accum_steps
        p.epoch_steps += 1
        # The step ends here: the log point's host syncs, all-reduces and print are not part of
        # any step's time.
        self.measured.timer.stop(p.epoch, measured)

    def _extend_to_min_window(self) -> None:
        """At the last step: if the measured steps add up to less than --min-window-s, or are fewer
        than --min-window-steps, add the steps missing (measured_window.steps_missing; the new
        last step is checked again). A collective: every rank agrees."""
        run = self.config.run
        added, window_s = measured_window.steps_missing(run.min_window_s, run.min_window_steps, self.measured.timer, self.ctx)
        if added:
            self.total_steps += added
            wanted = f"--min-window-s {run.min_window_s:g}, --min-window-steps {run.min_window_steps}"
            self.log(f"measured {window_s:.2f} s ({wanted}): {added} more steps (to {self.total_steps}) at the schedule's last learning rate")

    def _stop_received(self) -> bool:
        """Whether a stop signal reached this rank (the evaluation and the probes check it; the ranks
        then agree before they stop)."""
        return self.stop.signal_name is not None

    def _agreed_stop_signal(self) -> str | None:
        """The stop signal any rank received, agreed by all (a collective), or None."""
        received = signal.Signals[self.stop.signal_name].value if self.stop.signal_name else 0
        agreed = int(all_reduce_max(self.ctx, torch.tensor([float(received)], device=self.device)).item())
        return signal.Signals(agreed).name if agreed else None

    def _stopped_after_training(self, stop_signal: str, during: str) -> Outcome:
        """A stop after the last step (in the final evaluation or the probes): the run is preempted
        like any other, and its rerun measures again. It writes no new checkpoint: one at the last
        step leaves no steps for a warm-up and a measured window, so a resume would pass over it;
        the rerun resumes from the newest earlier one (--checkpoint-interval), else starts afresh."""
        self.log(
            f"stopped by {stop_signal} during {during}, after the last step: no checkpoint there (it would leave no steps "
            "to measure); the rerun resumes from the newest earlier one, else starts afresh"
        )
        return Outcome("preempted", stop_signal, self._checkpoint_path)

    def _stop_signal_between_log_points(self) -> str | None:
        """Ranks must agree on the step they stop after, so several ranks decide only at log
        points (``_log_point``); a single rank can stop after any step."""
        return None if self.ctx.distributed else self.stop.signal_name

    def _log_point(self, p: Progress, losses: RunningLoss, bar: ProgressBar) -> str | None:
        """Read the interval's loss (the one host sync of the interval), check it is finite, log a
        line, start the next interval, and agree across ranks whether to stop now: any rank
        signalled, all stop. Returns the name of the signal that stops the run (the
        highest-numbered one any rank received, so every rank, rank 0 among them, records it
        even when it reached another rank only)."""
        received = signal.Signals[self.stop.signal_name].value if self.stop.signal_name else 0
        flags = torch.tensor([float(losses.first_bad_step.item()), float(received)], device=self.device)
        all_reduce_max(self.ctx, flags)
        bad_step, agreed = int(flags[0].item()), int(flags[1].item())
        if bad_step >= 0:
            raise NonFiniteLossError(f"the loss became non-finite at step {bad_step}: lower --lr, add --clip-grad-norm, or use --precision bf16")
        # Interval loss = sum over ranks and steps of the step loss / (ranks x steps).
        mean_loss = self._global_sum(losses.interval) / (losses.interval_steps * self.ctx.world_size)
        elapsed = time.perf_counter() - losses.interval_started
        # Logged rate (host clock between log points, both synchronised): samples / seconds.
        rate = losses.interval_steps * self.global_batch / elapsed
        self.loss_log.append({"step": p.step, "loss": mean_loss, "samples_per_s": rate})
        if self.ctx.is_main:
            memory = metrics.peak_memory(self.device)
            peak = memory["allocated_bytes"] if memory["allocated_bytes"] is not None else memory["rss_bytes"]
            bar.write(
                f"step {p.step}/{self.total_steps} | epoch {p.epoch} | loss {mean_loss:.4f} | "
                f"{rate:,.1f} samples/s | lr {self.scheduler.get_last_lr()[0]:.3g} | peak mem {peak / 2**30:.2f} GiB"
            )
        losses.new_interval()
        return signal.Signals(agreed).name if agreed else None

    def _global_sum(self, value: torch.Tensor) -> float:
        return all_reduce_sum(self.ctx, value.detach().clone()).item()

    def _finish_epoch(self, p: Progress, epoch_loss_sum: float, complete: bool) -> None:
        """Close the epoch's history entry: mean training loss and, if enabled, evaluation."""
        entry: dict[str, Any] = {
            "epoch": p.epoch,
            "step": p.step,
            "complete": complete,
            # mean train loss = sum over ranks and steps of step losses / (ranks x steps)
            "train_loss": epoch_loss_sum / (p.epoch_steps * self.ctx.world_size) if p.epoch_steps else None,
        }
        if self.config.run.eval:
            batch_size = self.config.run.eval_batch_size or self.config.run.per_gpu_batch
            self.log(f"evaluating {self.eval_source.num_samples} held-out samples at batch {batch_size} per rank (not timed)")
            with self._outside_energy_window():
                result = evaluation.evaluate(
                    self.module,
                    self.pipeline,
                    self.eval_source,
                    batch_size,
                    self.dp_size,
                    self.dp_rank,
                    self.ctx,
                    self._channels_last,
                    self._forward_context,
                    stop_requested=self._stop_received,
                    budget_s=self.config.run.eval_budget_s,
                )
            if result is None:  # stopped: the caller honours the signal (at the next log point, or now after the last step)
                self.log(f"evaluation stopped by {self.stop.signal_name or 'a stop signal on another rank'}")
            else:
                entry.update(result)
        self.log(p.close_epoch(entry, complete, self.eval_source.num_samples, self.config.run.eval_budget_s))

    # ---- checkpoints ---------------------------------------------------------------------------

    def _checkpoint_mid_run(self, losses: RunningLoss) -> None:
        """A checkpoint inside the run also carries the epoch's loss sum so far, over all ranks
        (a collective: every rank calls this at the same step). Writing it is not training: the
        energy window pauses around it."""
        with self._outside_energy_window():
            self.progress.epoch_loss_sum = self._global_sum(losses.epoch)
            self._save_checkpoint()

    def _save_checkpoint(self, final: bool = False) -> None:
        if self.checkpoints is None:
            return
        self._checkpoint_path = run_state.save(
            self.checkpoints, self.state, self.ctx, dataclasses.asdict(self.progress), self._fingerprint, self.mesh is not None, final
        )

    def discard_checkpoints(self) -> None:
        """After the ``ok`` record is written: remove the run's checkpoints (but a final one kept
        on request). Rank 0 alone; the others hold no files."""
        if self.checkpoints is not None and self.ctx.is_main:
            kept = Path(self._checkpoint_path) if self._checkpoint_path else None
            for path in self.checkpoints.discard(keep=kept):
                self.log(f"removed checkpoint {path}: the run is finished and recorded")

    # ---- what the measuring modules are handed -------------------------------------------------

    @contextlib.contextmanager
    def _energy_window(self) -> Iterator[EnergyWindow]:
        """The energy window of ``fit`` (scalerepro.training.energy_window); its figures become the
        run's on exit, also when training fails (the failure record has them)."""
        run = self.config.run
        window = self._energy = EnergyWindow.for_device(self.device, run.nvml_interval_s, run.nvml_idle_s)
        try:
            yield window
        finally:
            window.stop()
            self.measured.take_window(window)

    def _outside_energy_window(self) -> contextlib.AbstractContextManager:
        """What runs inside is not a training step: the energy sampler pauses (a no-op when it is
        not sampling), so energy per sample covers the measured steps only."""
        return self._energy.paused() if self._energy is not None else contextlib.nullcontext()

    def _cached_step_batches(self, steps: int) -> list[list[sources.Batch]]:
        """The micro-batches of up to ``steps`` steps from the start of the current epoch, held
        in memory: a probe reuses them, so the loader is out of its timings."""
        micro = self.config.optim.grad_accum_steps
        batch_iter = self.loader.epoch(self.progress.epoch)
        return [[next(batch_iter) for _ in range(micro)] for _ in range(min(steps, self.steps_per_epoch))]

    def probed_run(self) -> probes.ProbedRun:
        """What the probes after training need of this run: its own step function (not a copy),
        its state, its batches, its parallel form."""
        p = self.config.parallel
        return probes.ProbedRun(
            step=self.probe_step,
            state=self.state,
            batches=self._cached_step_batches,
            ctx=self.ctx,
            ddp=self.ddp,
            sharded_by=p.parallel if self.mesh is not None else None,
            bucket_cap_mb=p.bucket_cap_mb,
            grad_accum_steps=self.config.optim.grad_accum_steps,
            stop_requested=self._stop_received,
            allreduce_timing=self.allreduce_timing,
        )

    def results(self, local_only: bool = False) -> measurements.Measurements:
        """Every figure of the run, reduced over ranks (a collective: all ranks must call it);
        scalerepro.training.measurements.results.

        ``local_only`` reports this rank's figures without any collective, for failed runs whose
        peers may be gone.
        """
        ctx = dataclasses.replace(self.ctx, backend=None) if local_only else self.ctx
        sharded = None
        if self.mesh is not None:
            sharded = measurements.ShardedModel(self.mesh, self.module, self.optimizer, self.pipeline, self.global_batch)
        return measurements.results(ctx, self.config, self.spec, self.steps_per_epoch, self.progress.history, self.measured, sharded)
