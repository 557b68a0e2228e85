"""The analysis side of a study: run records -> tidy tables (``aggregate``, with the statistics
over repeats of ``repeats`` and the alpha-beta ``scaling_model``) -> figures (``plots``) -> one
HTML report (``report``); ``profile`` reduces profiler captures, ``rebuild`` redoes all of it from a
finished study's files; every study is kept in a results store (``store``), compared with another
(``compare``) and shipped as a bundle (``bundle``).

It reads only the JSON run records, the study matrix and the communication benchmark files, and
never imports torch or the trainer: the analysis environment has neither.
"""
