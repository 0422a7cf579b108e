"""End to end: the replication records rerun, the reproducible mode, the notebooks, the release checkpoints, the
benchmark and GPU suites' dry runs."""
