"""`python -m align ...` (what `accelerate launch -m align ...` runs)."""

import sys

from align.cli import main

sys.exit(main())
