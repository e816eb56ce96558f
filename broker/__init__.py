"""MEMP broker: shared, versioned memory for AI agents."""

import os

# One BLAS thread per process unless the deployment says otherwise: the vector index's product
# is memory-bound, so more threads only compete with the event loop and with the other worker
# processes for the cores (docs/design.md, "Recall by meaning"). Set before numpy loads.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

__version__ = "0.1.0"
PROTOCOL_VERSION = "1.0"
