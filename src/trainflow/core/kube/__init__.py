"""Kubernetes backend: TrainJobs on a real cluster through the custom-objects API (sync and asyncio)."""
