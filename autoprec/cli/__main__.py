"""`python -m autoprec.cli`: the `autoprec` command."""

import sys

from . import main

sys.exit(main())
