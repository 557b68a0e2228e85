"""Run records to tidy tables: ``readers`` (matrix, records, comm benchmark), ``cell_tables``
(scaling, sensitivity, ablation, parallelism, cost), ``reproduction`` (published references),
``check_definitions`` (the config's checks, parsed; no pandas),
``checking`` (the checks evaluated), ``repeats`` (statistics over repeats), ``scaling_model`` (the
alpha-beta model) and ``aggregate`` (the rule's entry point)."""
