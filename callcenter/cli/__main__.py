"""`python -m callcenter.cli`."""

import sys

from callcenter.cli import main

sys.exit(main())
