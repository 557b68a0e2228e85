"""scalerepro: reproducible distributed deep-learning scaling studies.

The package is split so that the two sides of a study meet only in the run record:
``scalerepro.training.train`` and the modules it imports use torch; nothing here imports torch at
package import time, so analysis code can import ``scalerepro`` in an environment without it.
"""

__version__ = "0.1.0"
