"""Run records to tidy tables: ``readers`` (matrix, records, comm benchmark), ``cell_tables``
(scaling, sensitivity, ablation, parallelism, cost), ``reproduction`` (published references),
``published_comparison`` (each model beside its best and like-for-like published figures, with
``published_conditions`` and the ``gap_walk``),
``check_definitions`` (the config's checks, parsed; no pandas), ``checking`` (the checks evaluated), ``repeats`` (statistics over repeats), ``step_model`` (the
alpha-beta model: network fit and step replay), ``model_inputs`` (what it reads from the records),
``scaling_model`` (its table), ``published_steps`` (FSDP and published steps, for the back-test)
and ``aggregate`` (the rule's entry point)."""
