"""The theory behind ``stability``, checked rather than quoted.

- :mod:`.checks` — numerical checks of Props. 1–5, Lemma 1, Apps. A.3–A.8 and the two excerpts
  (``stability verify``);
- :mod:`.symbolic` — sympy derivations of App. A.7's Jacobians, Figure 5's conditions and the damping bound η₀;
- :mod:`.regions` — Figure 5's stability regions, the exact projection and the anisotropy experiment (Table 3);
- :mod:`.figures` — matplotlib builders for Figures 2 and 5 and Table 3's outputs (``stability figures``).

Nothing here imports the model or the trainer.
"""
