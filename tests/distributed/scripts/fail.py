"""Rank 1 fails with a clear error; rank 0 waits (it is stopped by the launcher)."""

import os
import sys
import time

if os.environ["RANK"] == "1":
    print("loading config ...", file=sys.stderr)
    print("ValueError: boom: learning rate must be positive", file=sys.stderr)
    sys.exit(3)
time.sleep(60)
