"""The stages of the analysis: one module per stage, each a :class:`~stability.analysis.stages.base.Stage` record
listed once, in run order, by :mod:`~stability.analysis.stages.registry`. A stage's module holds its function
(``run``: from :class:`~stability.analysis.fixed_point.AtFixedPoint` to its result), its typed result (whose
``to_dict()`` is its JSON block), its report rows, its headline numbers and what the verdict reads of it, and
nothing else. Adding a stage is one module, one registry line and its name in ``config.STAGES``
(docs/architecture.md, "Adding a stage").

==================  ====================  ==================================================================
stage               JSON key              what
==================  ====================  ==================================================================
``reachability``    ``fixed_point``       x* by the solver from e, statuses, cycles (Section 3.2)
``rho``             ``jacobian``          ρ(J*), σ_max, leading eigenvalues (Props. 3–4)
``prop4``           ``prop4``             ρ(M) from the named parts, against autograd (App. A.7)
``rho_wx``          ``recall``            ρ(W_x) of the recall weight (Figs. 6–7)
``prop5``           ``prop5``             the unrolled input-gradient → the implicit one
``input``           ``input_dependence``  ‖dx*/dx0‖_F (Prop. 5)
``a8``              ``initial_iterate``   A.8 local: ‖dx_T/de·u‖; global: x* from e ∈ {e, x0, zeros, noise}
``repelling``       ``repelling``         roots of f(x) − x by Broyden, classified by ρ(J) (App. A.1)
``accuracy``        ``accuracy``          accuracy against iteration and at x* (Fig. 3)
``geometry``        ``geometry``          radii of stability in parameter space, anisotropy (opt-in)
==================  ====================  ==================================================================

Prop. 4 and ρ(W_x) need a model with :class:`~stability.protocols.RecallParts` and are
:class:`~stability.analysis.stages.base.NotApplicable` otherwise; accuracy needs targets. The stages use the
:class:`~stability.protocols.LoopedModel` contract only. What a stage leaves for a later one is a member of the
AtFixedPoint (its module docstring has the table).

Every module here is torch-free at import (the report, the verdict, compare and the sweep's record read the JSON
through them); a stage's ``run`` imports the routines that compute it.
"""
