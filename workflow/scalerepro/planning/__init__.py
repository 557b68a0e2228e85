"""What Snakemake runs while it builds the DAG, no torch: the invocation's plan (``plan``: the
config validated, the scheduler, each job's resources), the study model (``study``: every run
and its trainer flags) and what a batch system is asked for (``submission``). No job imports
it, so editing it reruns no job whose plan it leaves alone."""
