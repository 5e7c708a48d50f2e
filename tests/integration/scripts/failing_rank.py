"""A torchrun worker: global rank $FAIL_RANK prints a marker and exits with $FAIL_CODE; others sleep."""

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank={rank} started", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    print(f"rank={rank} boom: simulated failure", flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
time.sleep(60)
