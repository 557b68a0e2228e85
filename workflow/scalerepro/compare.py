"""``python -m scalerepro.compare BASELINE CANDIDATE``: see ``scalerepro.analysis.compare``.

The logic lives on the analysis side (no torch); this entry point only gives it its short name.
"""

import sys

from scalerepro.analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
