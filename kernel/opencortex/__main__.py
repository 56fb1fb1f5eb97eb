"""`python -m opencortex` is the `opencortex` command."""

import sys

from opencortex.cli import main

sys.exit(main())
