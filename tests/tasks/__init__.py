"""The tasks and their data (stability/tasks, `stability data`): prefix sums, sudoku, chess, disjoint splits."""
