"""The reason a record gives where its exposed-communication probe did not run by request
(``--comm-probe-steps 0``): the rank writes it (scalerepro.training.probes) and the analysis
matches it (scalerepro.analysis.tables.readers.cell_probes: under a study budget a later repeat's
probe is off by plan, and it takes its cell's repeat 1's), so it is written here once."""

PROBE_OFF_REASON = "--comm-probe-steps 0"
