"""The rank (torch): ``train`` is the entry point, ``trainer`` the loop with its one step
function, ``distributed`` the process-group setup, ``optim`` and ``objective``, checkpoints
(``checkpoint``, ``sharded_checkpoint``), the bucket probe of the scaling model (``buckets``),
the all-reduce benchmark (``commbench``) and the run record rank 0 writes (``record``)."""
