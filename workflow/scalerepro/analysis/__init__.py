"""The analysis side of a study: run records -> tidy tables (``tables``) -> figures and one HTML
report (``presentation``); profiler captures reduced (``profiles``); every study kept, compared
and shipped (``history``); ``columns`` names the shared tables' columns and vocabularies once;
``values`` turns a table's cells into plain Python values; ``rebuild`` redoes all of it from a
finished study's files.

It reads only the JSON run records, the study matrix, the profile captures and the communication
benchmark files, and imports nothing of the package but ``scalerepro.common``: never torch or
the trainer (the analysis environment has neither).
"""
