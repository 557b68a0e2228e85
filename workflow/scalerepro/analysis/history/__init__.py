"""Studies kept and compared: the DuckDB results store (``store``), one study against another
(``compare``) and bundles that carry a study between groups (``bundle``)."""
