"""The embedded local engine: runs TrainJobs on this machine, no Kubernetes, state under ``$TRAINFLOW_HOME``.

``store`` (on-disk state, locks, process bookkeeping), ``policies`` (ML-policy env contracts),
``supervisor`` (the detached per-job process) and ``engine`` (``LocalBackend``).
"""
