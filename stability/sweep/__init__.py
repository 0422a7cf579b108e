"""The paper's grid (App. B.5–B.6): grid files, executors (local pool, SLURM via submitit), records, tables, figures.

``grid.load(path)`` expands a TOML grid into cells; ``runner.run_cell`` trains one and writes its record, whose
format is the typed ``record.SweepRecord`` (every loader reads records through it); ``executors`` run many;
``tables`` and ``figures`` read the records back (Tables 4–6, Figures 3, 6, 7), ``claims`` judges the paper's
registered claims from them.
"""
