"""What holds at x* (stability/analysis, stability/compare.py): the stages, the pipeline, geometry,
repelling fixed points, halting, side-by-side splits, the LoopedModel contract."""
