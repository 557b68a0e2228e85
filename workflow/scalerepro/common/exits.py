"""The exit codes a rank, the launcher and the job wrapper agree on."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Stopped by SIGTERM/SIGUSR1 after checkpointing: EX_TEMPFAIL (sysexits.h), "run again with --resume".
EXIT_PREEMPTED = 75
