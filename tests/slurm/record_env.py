"""``python record_env.py -m align step ...``: the step, after writing the job's HF_TOKEN to $RECORD_ENV.

A test's recipe names it (through a shell wrapper) as a step's Python, to see what the job's
environment holds without printing it.
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    with open(os.environ["RECORD_ENV"], "w", encoding="utf-8") as out:
        json.dump({"HF_TOKEN": os.environ.get("HF_TOKEN")}, out)
    from align.cli import main

    sys.exit(main(sys.argv[3:]))
