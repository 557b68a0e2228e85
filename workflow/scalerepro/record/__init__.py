"""The run record, typed once: the model the rank writes (``model``), the chain that reads every
older record into it (``upgrade``), what a record must be to count (``evidence``), the one
definition of a cell (``cell``) and the runs table's columns (``columns``).

Both sides import this package and nothing of each other: the rank builds a ``RunRecord`` and
writes it; the analysis reads records only through ``read``. Standard library, pydantic and
``scalerepro.common`` only: no torch, no pandas.
"""
