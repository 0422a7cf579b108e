"""The model under perturbed parameters θ* + t·D, for the geometry stage (:mod:`stability.analysis.geometry`).

**Directions** in parameter space are Gaussian, drawn from a seeded generator, and scaled tensor by tensor: the part
of D on a parameter tensor W is z·‖W‖/‖z‖ (z standard normal of W's shape), so ``t`` is a *relative*
perturbation — t = 0.1 moves every tensor by 10 % of its norm (an all-zero tensor by 10 % of the loop parameters'
RMS per entry) (:func:`random_directions`). Parameters are perturbed with ``torch.func.functional_call`` (the model
itself is never edited); the embedding's parameters move x0 = embed(inputs) too; parameters that enter neither
``step`` nor ``embed`` (the readout) cannot move x* or J* and are left out (``outside_loop``,
:func:`loop_parameters`). :class:`Family` holds many perturbed parameter sets at once, one per row, and evaluates
the model's maps for all of them (vmapped over the rows where the model's code allows it).

**Which parts are narrow.** The same radii with D restricted to one group of parameters: for a model with the
named parts of :class:`~stability.protocols.RecallParts`, the recall weight W_x, the rest of the recall map g,
attention (h(1, ·)), MLP (h(2, ·)), the norm gains (pre, φ and every *Norm module), the residual R (a GRU cell),
the embedding and what remains; for any other model the groups are named by parameter name (first component).
A part is found by calling it under ``functional_call`` and asking autograd which parameters it reached
(:func:`parameter_groups`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from stability.protocols import has_recall_parts


class _Method(torch.nn.Module):
    """``model.<name>(*args)`` as a module's forward, so that ``functional_call`` can swap the model's parameters."""

    def __init__(self, model: torch.nn.Module, name: str):
        super().__init__()
        self.model = model
        self.name = name

    def forward(self, *args):
        return getattr(self.model, self.name)(*args)


def _call(model, name: str, params: dict, *args):
    """``model.<name>(*args)`` with ``params`` (name → tensor, a subset of the model's) in place of its own."""
    return torch.func.functional_call(_Method(model, name), {"model." + k: v for k, v in params.items()}, args,
                                      strict=False)


class Family:
    """Rows of perturbed parameters, each with its own input, and the model's maps under them.

    ``base``: the loop parameters (name → tensor); ``dirs``: name → (n_directions, *shape) stacked directions
    (zero where a direction leaves a tensor alone). A row r has the parameters θ* + t_r·sign_r·D_{dir_r}
    (``row_dir``, ``row_sign``; t_r set by :meth:`set_t`), or, with ``coef`` (R, n_directions), θ* + Σ_j
    coef_rj·D_j (the plane picture); ``row_input``: the row's sample inputs. ``step(x, rows)`` is the loop map of
    the rows ``rows`` (an index tensor: the solver passes it through as its x0, so it can freeze and restrict
    rows as it does samples); their x0 are the embedding at their current parameters (``embed_moves``: the
    embedding has perturbed parameters; otherwise ``x0`` stays as given)."""

    def __init__(self, model, base: dict, dirs: dict, row_input: torch.Tensor, x0: torch.Tensor, *,
                 row_dir: Optional[torch.Tensor] = None, row_sign: Optional[torch.Tensor] = None,
                 coef: Optional[torch.Tensor] = None, embed_moves: bool = True):
        self.model, self.base, self.dirs, self.inputs = model, base, dirs, row_input
        self.row_dir, self.row_sign, self.coef = row_dir, row_sign, coef
        R = int(row_input.shape[0])
        dev = next(iter(base.values())).device
        self.t = torch.zeros(R, dtype=torch.float64, device=dev)
        self.embed_moves = embed_moves
        self.x0 = x0.detach().clone()
        self.vmap = True
        self.calls = 0
        # the eigensolver's restart for ρ(J*) of the rows (AnalysisOptions.eig_restart: batched with --batch all)
        self.eig_restart = "auto"
        self._wrappers: dict = {}
        self._vmapped: dict = {}
        # every row's parameters, kept (R, *shape) per tensor and updated for the rows whose t changes
        if coef is not None:
            self.P = {k: v + torch.einsum("ac,c...->a...", coef.to(v), dirs[k]) for k, v in base.items()}
            if embed_moves:
                idx = torch.arange(R, device=dev)
                self.x0 = self.map("embed", idx, self.inputs).detach().to(self.x0.dtype)
        else:
            self.P = {k: v.unsqueeze(0).repeat(R, *([1] * v.dim())) for k, v in base.items()}

    def params(self, rows: torch.Tensor) -> dict:
        """The perturbed loop parameters of ``rows``: name → (len(rows), *shape)."""
        return {k: v[rows] for k, v in self.P.items()}

    def set_t(self, rows: torch.Tensor, t: torch.Tensor) -> None:
        """Move the rows ``rows`` to step sizes ``t`` (and their x0 with them where the embedding moves)."""
        if rows.numel() == 0:
            return
        self.t[rows] = t.to(self.t)
        s = self.t[rows] * self.row_sign[rows]
        d = self.row_dir[rows]
        for k, v in self.base.items():
            self.P[k][rows] = v + s.to(v).view(-1, *([1] * v.dim())) * self.dirs[k][d]
        if self.embed_moves:
            self.x0[rows] = self.map("embed", rows, self.inputs[rows]).detach().to(self.x0.dtype)

    def map(self, name: str, rows: torch.Tensor, *args):
        """``model.<name>`` of every row in ``rows`` on its own parameters (args batch-first, one row each)."""
        P = self.params(rows)
        self.calls += 1
        wrapper = self._wrappers.get(name)
        if wrapper is None:
            wrapper = self._wrappers[name] = _Method(self.model, name)
        if self.vmap:
            fn = self._vmapped.get(name)
            if fn is None:
                def one(p, *a, _w=wrapper):
                    return torch.func.functional_call(_w, p, tuple(t.unsqueeze(0) for t in a), strict=False)[0]

                fn = self._vmapped[name] = torch.func.vmap(one)
            try:
                return fn({"model." + k: v for k, v in P.items()}, *args)
            except (RuntimeError, ValueError, NotImplementedError, TypeError):
                self.vmap = False  # an operation vmap cannot batch: one row at a time from here on
        outs = [torch.func.functional_call(wrapper, {"model." + k: v[i] for k, v in P.items()},
                                           tuple(a[i:i + 1] for a in args), strict=False)
                for i in range(int(rows.numel()))]
        return torch.cat(outs)

    def step(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The loop map of the rows ``rows`` at their current parameters: step(x_r, x0_r)."""
        return self.map("step", rows, x, self.x0[rows])


# ---- parameters: which enter the loop, and their groups --------------------------------------------------------

def graph_leaves(out) -> set:
    """The ids of the leaf tensors autograd's graph of ``out`` reaches (its AccumulateGrad nodes' variables): the
    parameters an output depends on, read off the graph without computing a gradient."""
    found, seen, todo = set(), set(), [getattr(out, "grad_fn", None)]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf
        if var is not None:
            found.add(id(var))
        todo.extend(n for n, _ in node.next_functions)
    return found


def reached_parameters(model, name: str, params: dict, args) -> set:
    """The names of ``params`` that ``model.<name>(*args)`` reaches (autograd's graph, not values; the parameters
    made graph leaves by ``detach``, which shares their storage: no copy, no gradient)."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    with torch.enable_grad():
        out = _call(model, name, leaves, *args)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:  # reaches no parameter (an identity)
        return set()
    found = graph_leaves(out)
    return {k for k, v in leaves.items() if id(v) in found}


def loop_parameters(model, inputs: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> tuple[list, list, list]:
    """(names that ``step`` or ``embed`` reach, names that neither does, names that ``embed`` reaches) of the
    model's floating-point parameters (autograd's graph on one sample: structural, not a test of values)."""
    params = {k: v for k, v in model.named_parameters() if v.is_floating_point()}
    in_embed = reached_parameters(model, "embed", params, (inputs,))
    used = reached_parameters(model, "step", params, (x, x0)) | in_embed
    return [k for k in params if k in used], [k for k in params if k not in used], [k for k in params if k in in_embed]


def _is_norm_param(model, name: str) -> bool:
    mod = model
    for part in name.split(".")[:-1]:
        mod = getattr(mod, part, None)
        if mod is None:
            return False
    return "norm" in type(mod).__name__.lower()


def parameter_groups(model, names: list, inputs: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> dict:
    """Group name → parameter names (loop parameters only, each in one group, empty groups left out).

    With the named parts of :class:`~stability.protocols.RecallParts`: W_x, the rest of g, attention (h1), MLP
    (h2), norm gains, residual (R), embedding, other — each part found by calling it under ``functional_call`` and
    asking autograd which parameters it reached. A model with a ``parameter_groups()`` method (label → names: a
    language model's, :meth:`stability.lm.LMAdapter.parameter_groups`) gives its own. Otherwise by the first
    component of the parameter name (the first two when that gives a single group)."""
    params = {k: v for k, v in model.named_parameters() if k in names}
    groups: dict[str, list] = {}
    if callable(getattr(model, "parameter_groups", None)):  # the model's own groups (a language model's by type)
        for label, members in model.parameter_groups().items():
            got = [k for k in params if k in set(members) and not any(k in g for g in groups.values())]
            if got:
                groups[label] = got
        rest = [k for k in params if not any(k in g for g in groups.values())]
        if rest:
            groups.setdefault("other", []).extend(rest)
        return groups
    if has_recall_parts(model):
        wx = getattr(model, "W_x", None)
        wx_name = next((k for k, v in params.items() if wx is not None and v is wx), None)
        u = x[:1]
        parts = {}
        try:
            parts["g"] = reached_parameters(model, "g", params, (u, x0[:1]))
            parts["h1"] = _used_part(model, "h", 1, params, u)
            parts["h2"] = _used_part(model, "h", 2, params, u)
            parts["norm"] = (_used_part(model, "pre", 1, params, u) | _used_part(model, "pre", 2, params, u)
                             | _used_part(model, "phi", 1, params, u) | _used_part(model, "phi", 2, params, u))
            parts["residual"] = _used_part(model, "residual", 1, params, u, u) | \
                _used_part(model, "residual", 2, params, u, u)
            parts["embed"] = reached_parameters(model, "embed", params, (inputs[:1],))
        except Exception:  # noqa: BLE001 - a part that cannot be called alone: name the groups by parameter name
            parts = None
        if parts is not None:
            order = [("W_x (recall weight)", {wx_name} if wx_name else set()),
                     ("norm gains", parts["norm"] | {k for k in params if _is_norm_param(model, k)}),
                     ("recall g (W_0, biases)", parts["g"]), ("attention (h1)", parts["h1"]),
                     ("MLP (h2)", parts["h2"]), ("residual (R)", parts["residual"]), ("embedding", parts["embed"])]
            seen: set = set()
            for label, members in order:
                got = [k for k in params if k in members and k not in seen]
                if got:
                    groups[label] = got
                    seen.update(got)
            rest = [k for k in params if k not in seen]
            if rest:
                groups["other"] = rest
            return groups
    for depth in (1, 2):
        groups = {}
        for k in params:
            groups.setdefault(".".join(k.split(".")[:depth]), []).append(k)
        if len(groups) > 1:
            break
    return groups


def _used_part(model, name: str, s: int, params: dict, *args) -> set:
    """:func:`reached_parameters` for a part called as ``model.<name>(s, *args)`` (pre, h, residual, phi)."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}

    class _Part(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *a):
            return getattr(self.model, name)(s, *a)

    with torch.enable_grad():
        out = torch.func.functional_call(_Part(), {"model." + k: v for k, v in leaves.items()}, args, strict=False)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return set()
    found = graph_leaves(out)
    return {k for k, v in leaves.items() if id(v) in found}


def loop_rms(base: dict) -> float:
    """The RMS per entry of the loop parameters (the scale of a direction on an all-zero tensor)."""
    total = sum(float(v.double().pow(2).sum()) for v in base.values())
    return math.sqrt(total / max(1, sum(v.numel() for v in base.values())))


def scaled_direction(z: torch.Tensor, v: torch.Tensor, rms: float) -> torch.Tensor:
    """A direction's part on the tensor W = ``v``: z·‖W‖/‖z‖ (an all-zero W: the RMS per entry for ‖W‖), in v's
    dtype."""
    scale = float(v.double().norm()) or rms * math.sqrt(v.numel())
    return (z * (scale / max(float(z.norm()), 1e-300))).to(v)


def random_directions(base: dict, count: int, seed: int, members: Optional[list] = None,
                      keep: Optional[list] = None) -> dict:
    """``count`` Gaussian directions, name → (count, *shape): on each tensor W in ``members`` (default all),
    z·‖W‖/‖z‖ with z ~ N(0, I) from ``torch.Generator().manual_seed(seed)`` (tensors in name order, directions
    one after the other); an all-zero W gets the RMS of the parameters per entry instead of ‖W‖; zero elsewhere.
    ``keep``: the indices of the directions to return, (len(keep), *shape): the same draws, the others drawn and
    dropped (a model too large to hold every direction at once: the geometry stage's chunks)."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    rms = loop_rms(base)
    keep = list(range(count)) if keep is None else list(keep)
    out = {k: torch.zeros((len(keep), *v.shape), dtype=v.dtype, device=v.device) for k, v in base.items()}
    for j in range(min(count, max(keep, default=-1) + 1)):
        for k in sorted(base):
            if members is not None and k not in members:
                continue
            z = torch.randn(base[k].shape, generator=gen, dtype=torch.float64)
            if j in keep:
                out[k][keep.index(j)] = scaled_direction(z, base[k], rms)
    return out
