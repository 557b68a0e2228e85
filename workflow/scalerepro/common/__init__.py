"""What every side of the package shares, standard library only: atomic files and timestamps
(``files``), the one-line command-line parser (``cli``), exit codes (``exits``), the profiler's
range names (``range_names``), the GPU peak table (``gpu_peaks``), reductions where a figure may
be missing (``reductions``) and the import closure of a program (``source_closure``: what an
edit reruns)."""
