"""The command line's behaviour (stability/cli.py, stability/commands): real processes, bad input, faults,
one-line errors, the thread policy, missing extras."""
