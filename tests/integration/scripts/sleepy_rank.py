"""A torchrun worker that sleeps (for cancel / kill tests): prints its rank and pid, then sleeps."""

import os
import sys
import time

print(f"rank={os.environ.get('RANK')} pid={os.getpid()} ready", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120)
print(f"rank={os.environ.get('RANK')} done", flush=True)
