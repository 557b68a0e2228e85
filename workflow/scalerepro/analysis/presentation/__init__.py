"""What a reader sees: the list of figures (``figures``), the seaborn figures (``plots``) and the
self-contained HTML report (``report``)."""
