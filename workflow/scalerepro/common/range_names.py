"""The names of the trainer's profiler ranges (NVTX or torch.profiler record_function): the rank
opens them (``scalerepro.telemetry.ranges``), the analysis finds the step window by them
(``scalerepro.analysis.profiles``)."""

RANGE_PREFIX = "scalerepro:"
# What each range covers; the analysis reads "data" as host time waiting for the next batch and
# "allreduce" as a DDP bucket's all-reduce.
RANGES = ("step", "data", "forward", "backward", "optimizer", "allreduce")
