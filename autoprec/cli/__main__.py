"""`python -m autoprec.cli`: the `autoprec` command."""

import sys

from .app import main

sys.exit(main())
