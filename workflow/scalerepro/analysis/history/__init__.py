"""Studies kept and compared: the DuckDB results store (``store``: append, select, history and its
command line; ``store_file``: the file's schema, lock and migrations; ``study_rows``: a study's
files as the store's rows), one study against another (``compare``) and bundles that carry a
study between groups (``bundle``)."""
