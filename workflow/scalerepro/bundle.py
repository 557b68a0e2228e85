"""``python -m scalerepro.bundle export|import``: see ``scalerepro.analysis.bundle``.

The logic lives on the analysis side (no torch); this entry point only gives it its short name.
"""

import sys

from scalerepro.analysis.bundle import main

if __name__ == "__main__":
    sys.exit(main())
