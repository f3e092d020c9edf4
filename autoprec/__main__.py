"""`python -m autoprec`: the `autoprec` command."""

import sys

from .cli import main

sys.exit(main())
