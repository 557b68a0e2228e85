"""What a reader sees: the figures' names (``figure_names``), the seaborn figures (``plots``) and the
self-contained HTML report (``report``; it reads with ``inputs``, writes values with ``formatting``
and lays sections out with ``headline`` and the ``*_view`` modules)."""
