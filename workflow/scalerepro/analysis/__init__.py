"""The analysis side of a study: run records -> tidy tables (``aggregate``) -> figures (``plots``)
-> one HTML report (``report``); every study kept in a results store (``store``), compared with
another (``compare``) and shipped as a bundle (``bundle``).

It reads only the JSON run records, the study matrix and the communication benchmark files, and
never imports torch or the trainer: the analysis environment has neither.
"""
