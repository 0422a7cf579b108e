"""The tests, one directory per layer of the package (numerics, model, solvers, analysis, theory, tasks, train,
sweep), the command line (cli), end-to-end runs (e2e) and repository-wide checks (house); shared fixtures and
``ROOT`` / ``FIXTURES`` in conftest.py, the independent numerical references in reference_numerics.py, committed
files in fixtures/. Every directory is a package (two layers may hold test files of the same name), so a test
imports the shared modules as ``tests.conftest`` and ``tests.reference_numerics``."""
