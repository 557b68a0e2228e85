"""What a reader sees: the figures' names (``figure_names``), the seaborn figures (``plots``, with
``plot_basics``, ``profile_plots`` and ``model_plots``) and the self-contained HTML report
(``report``; it reads with ``inputs``, derives what it says with ``report_facts``, writes values
with ``formatting`` and lays sections out with ``headline`` and the ``*_view`` modules)."""
