"""Numerical checks of the theory the toolkit rests on: one :class:`Check` per property, run by ``stability verify``.

Each verifier states a property of the paper (Props. 1–5, Lemma 1, Apps. A.3–A.8, B.2) or of the two excerpts
(Fixed-Point Reasoners "FPRM": residual bound, damping bound of A.3, truncated-Neumann error of A.4; Attractor
Models: Corollary 1, the implicit gradient of eq. 8, the barrier of B.3.3), measures it on random or constructed
instances, and compares the measurement with a stated tolerance. Each can fail: ``wrong=True`` swaps in a
deliberately wrong claim or a non-generic instance (described in ``Verifier.wrong``), which the tests show is
rejected. Symbolic derivations (:mod:`stability.theory.symbolic`) and the exact projection of App. B.2
(:mod:`stability.theory.regions`) appear as checks too, so ``stability verify`` prints the whole account in one
table (docs/theory.md lists every check).

Instances are small (d ≤ 16) and float64. The modules, in the order of the table:

- :mod:`.registry` — :class:`Check`, :class:`Verifier`, the registry :data:`VERIFIERS`, :func:`run_checks`, the
  table's rows (:func:`format_row`);
- :mod:`.instances` — numpy tanh maps with a prescribed fixed point and Jacobian, batched Newton, clusters;
- :mod:`.autonomous` — Props. 1–3 and App. A.3–A.4 on autonomous maps;
- :mod:`.recall` — the two-sublayer recall model :class:`~.recall.ToyRecall` (Defs. 5.1, 5.2), Prop. 4, App. A.7;
- :mod:`.input_gradient` — Prop. 5 / App. A.6, App. A.8 and Lemma 1;
- :mod:`.fprm`, :mod:`.attractor` — the two excerpts' results;
- :mod:`.symbolic_rows` — the sympy derivations and App. B.2's exact projection as rows.
"""

from .registry import (RELATIONS, VERIFIERS, Check, Verifier, format_listing, format_row, format_value, run_checks,
                       verifier)

# Importing a check module registers its checks; this order is the order of the table.
from . import autonomous, recall, input_gradient, fprm, attractor, symbolic_rows  # noqa: F401,I001

__all__ = ["RELATIONS", "VERIFIERS", "Check", "Verifier", "format_listing", "format_row", "format_value", "run_checks",
           "verifier"]
