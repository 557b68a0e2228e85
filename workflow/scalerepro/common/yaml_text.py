"""YAML read as ``yaml.safe_load`` reads it, parsed by libyaml where PyYAML was built with it.

Every command of the workflow and the analysis reads config/references.yaml and a schema or two,
which PyYAML's pure-Python parser reads about ten times slower than libyaml (benchmarks/README.md,
"The test suite's time, round 2"). The documents come out the same (safe types only, anchors and
merge keys alike).
"""

from __future__ import annotations

from typing import Any

import yaml

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """The document in ``text`` (yaml.YAMLError where it is not YAML), as ``yaml.safe_load``."""
    return yaml.load(text, Loader=SAFE_LOADER)  # a safe loader (libyaml's or PyYAML's): no arbitrary objects
