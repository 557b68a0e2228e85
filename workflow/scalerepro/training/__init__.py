"""The rank (torch): ``train`` is the entry point, ``run_setup`` what it does before the Trainer
(the resolved config, the process-global state), ``trainer`` the loop with its step and the
probes' step, and what the loop hands over: ``parallel_form`` (the model sharded, cut into
stages or left for DDP), ``measured_window`` (the warm-up and --min-window-s), ``stop_request``
(the stop signals), ``progress`` (position, running loss, bar), ``evaluation``, ``run_state``
(the run's state in and out of ``checkpoint_store`` and ``sharded_checkpoint_store``),
``energy_window``, ``probes`` (exposed communication and the bucket probe of the scaling model,
with ``buckets``), ``measurements`` (the record's figures); beside them ``distributed``
(process-group setup), ``optim`` and ``objective``, the all-reduce benchmark (``commbench``) and
the run record rank 0 writes (``record``)."""
