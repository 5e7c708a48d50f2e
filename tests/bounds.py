"""Wall-clock bounds shared by the tests (imported as ``from bounds import HANG``, like tests/hf_tiny.py)."""

# A hang detector for waits on what ends by itself (a job, a subprocess, a fake server's answer, a thread), in
# seconds: far above the worst case measured at load (a local-engine job's start took over 60 s at load ~20 on
# 2 cores). Never the behaviour under test: a wait that is expected to time out keeps its own short bound.
HANG = 600.0
