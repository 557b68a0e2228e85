"""How a job's ranks start, no torch: ``launch`` (local ranks on their own cores, or one srun
step of torchrun per node), ``run_job`` (the train rule's wrapper), ``rank_failure`` (a crashed
rank's record and one line), ``nsight`` and ``profile_job`` (a job under nsys, ncu or
torch.profiler)."""
