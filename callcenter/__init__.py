"""callcenter: a telephony contact-center agent that runs on one ordinary machine."""

import os

# Every stage works on small arrays (20 ms frames, one sentence): a multi-threaded BLAS only spins
# and fights the other calls' threads for the cores. Set before numpy is first imported.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

__version__ = "0.1.0"
