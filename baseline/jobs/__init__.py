"""Background jobs: the snapshot scheduler, the scoring orchestration, leadership among portal
processes, and the worker process."""
