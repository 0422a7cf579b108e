"""Training (stability/train, stability/checkpoint.py, stability/migrate.py): the methods, checkpoints, the monitor."""
