"""The rank (torch): ``train`` is the entry point, ``trainer`` the loop with its one step
function, and what the loop hands over: ``progress`` (position, running loss, bar),
``evaluation``, ``run_state`` (the run's state in and out of ``checkpoint_store`` and
``sharded_checkpoint_store``), ``energy_window``, ``probes`` (exposed communication and the bucket
probe of the scaling model, with ``buckets``), ``measurements`` (the record's figures); beside
them ``distributed`` (process-group setup), ``optim`` and ``objective``, the all-reduce benchmark
(``commbench``) and the run record rank 0 writes (``record``)."""
