"""The analysis side of a study: run records -> tidy tables (``aggregate``) -> figures (``plots``)
-> one HTML report (``report``).

It reads only the JSON run records, the study matrix and the communication benchmark files, and
never imports torch or the trainer: the analysis environment has neither.
"""
