"""The geometry stage's perturbed parameters applied in place (:mod:`stability.analysis.geometry`): for a model too
large to hold a perturbed parameter set per row (a language model, whose loop is most of it), θ* + t·D is written
into the model's own loop parameters one row at a time (:class:`InPlace`, the rows and maps of
:class:`~stability.analysis.perturbation.Family`), θ* kept once to put back bit for bit (:class:`Theta`), and the
directions regenerated tensor by tensor from their generator's state (:func:`direction_state`) rather than held."""

from __future__ import annotations

import math
from typing import Optional

import torch

from stability.analysis.perturbation import loop_rms


def _skip_direction(gen: torch.Generator, base: dict, members: Optional[list]) -> None:
    """One direction's draws of :func:`~stability.analysis.perturbation.random_directions`, made and dropped
    (a tensor at a time)."""
    for k in sorted(base):
        if members is None or k in members:
            torch.randn(base[k].shape, generator=gen, dtype=torch.float64)


def direction_state(base: dict, j: int, seed: int, members: Optional[list] = None) -> torch.Tensor:
    """The state of :func:`random_directions`' generator (``seed``, ``members``) just before it draws direction
    ``j``: the draws of directions 0 … j − 1 made and dropped."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    for _ in range(j):
        _skip_direction(gen, base, members)
    return gen.get_state()


class Theta:
    """θ*, the loop parameters as the model holds them, kept once so that the model can be moved in place and put
    back bit for bit (:class:`InPlace`): each tensor in the narrowest dtype that holds its values exactly (float32
    where a float64 parameter holds float32 values, as a float64 copy of a float32 checkpoint does: half its size).
    ``dtype``: the analysis precision, in which θ* + t·D is computed (a float32-stored tensor too)."""

    def __init__(self, model, names: list, dtype: torch.dtype):
        self.params = {k: p for k, p in model.named_parameters() if k in set(names)}
        self.dtype = dtype
        self.kept = {k: _narrowest(p.detach()) for k, p in self.params.items()}
        rms = loop_rms(self.kept)
        # ‖W‖ of each tensor (an all-zero W: the RMS per entry): a direction's scale there (random_directions)
        self.scale = {k: float(v.double().norm()) or rms * math.sqrt(v.numel()) for k, v in self.kept.items()}
        self._states: dict = {}

    def state(self, j: int, seed: int, members: Optional[list]) -> torch.Tensor:
        """:func:`direction_state` of the draw (``seed``, ``members``) before direction ``j``, kept per draw."""
        key = (int(seed), None if members is None else tuple(sorted(members)))
        have = self._states.setdefault(key, [torch.Generator(device="cpu").manual_seed(int(seed)).get_state()])
        while len(have) <= j:
            gen = torch.Generator(device="cpu")
            gen.set_state(have[-1])
            _skip_direction(gen, self.kept, members)
            have.append(gen.get_state())
        return have[j]

    def direction(self, k: str, gen: torch.Generator, members: Optional[list]) -> torch.Tensor:
        """The next tensor ``k`` of the direction ``gen`` draws, in the analysis precision: z·‖W‖/‖z‖, or zero
        outside ``members`` (as :func:`~stability.analysis.perturbation.scaled_direction`, z scaled in place)."""
        v = self.kept[k]
        if members is not None and k not in members:
            return torch.zeros(v.shape, dtype=self.dtype)
        z = torch.randn(v.shape, generator=gen, dtype=torch.float64)
        return z.mul_(self.scale[k] / max(float(z.norm()), 1e-300)).to(self.dtype)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.kept.values())

    def restore(self) -> None:
        """The model's loop parameters back to θ*, bit for bit."""
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(self.kept[k])


def _narrowest(v: torch.Tensor) -> torch.Tensor:
    if v.dtype == torch.float64 and torch.equal(v.float().double(), v):
        return v.float()
    return v.clone()


class InPlace:
    """Perturbed parameters written into the model's own loop parameters, one row at a time (the geometry stage of a
    model too large to hold perturbed copies, such as a language model whose loop is most of it). The same rows and
    maps as :class:`Family` — row r at θ* + t_r·sign_r·D_{dir_r}, or θ* + Σ_j coef_rj·D_j — computed tensor by
    tensor as :class:`Family` computes them and copied into the parameter, so the model's own forward is the
    perturbed map. Nothing is held per row or per direction: θ* once (:class:`Theta`), the directions regenerated
    tensor by tensor from their generator's state (``specs``: the draws (label, j, seed, members, count) of
    :func:`random_directions`, indexed by ``row_dir`` or by coef's columns) whenever a row is loaded. A map is
    evaluated for one row at a time (a cached vjp holds the parameters it was taken at; several rows would need
    several parameter sets); :meth:`close` puts θ* back."""

    vmap = False

    def __init__(self, model, theta: Theta, specs: list, row_input: torch.Tensor, x0: torch.Tensor, *,
                 row_dir: Optional[torch.Tensor] = None, row_sign: Optional[torch.Tensor] = None,
                 coef: Optional[torch.Tensor] = None, embed_moves: bool = True):
        self.model, self.theta, self.inputs = model, theta, row_input
        self.row_dir, self.row_sign, self.coef = row_dir, row_sign, coef
        self.states = [theta.state(j, sd, members) for _, j, sd, members, _ in specs]
        self.members = [members for *_, members, _ in specs]
        self.t = torch.zeros(int(row_input.shape[0]), dtype=torch.float64)
        self.x0 = x0.detach().clone()
        self.embed_moves, self.calls, self.eig_restart, self.current = embed_moves, 0, "auto", None

    def _load(self, r: int) -> None:
        """Row r's parameters into the model (its x0 with them where the embedding moves)."""
        th = self.theta
        cols = [int(self.row_dir[r])] if self.coef is None else list(range(self.coef.shape[1]))
        gens = [torch.Generator(device="cpu") for _ in cols]
        for g, c in zip(gens, cols):
            g.set_state(self.states[c])
        with torch.no_grad():
            for k in sorted(th.params):  # θ* + Σ c·D, as Family computes it, one tensor's direction at a time
                ds = [th.direction(k, g, self.members[c]) for g, c in zip(gens, cols)]
                if self.coef is None:
                    s = (self.t[r:r + 1] * self.row_sign[r:r + 1].cpu()).to(th.dtype)
                    value = ds[0].mul_(s).add_(th.kept[k])  # fl(fl(s·d) + θ*): Family's bits, no other copy
                else:
                    value = th.kept[k].to(th.dtype) + torch.einsum("c,c...->...", self.coef[r].to(th.dtype),
                                                                   torch.stack(ds))
                th.params[k].copy_(value)
        self.current = r
        if self.embed_moves:
            self.x0[r:r + 1] = self.model.embed(self.inputs[r:r + 1]).detach().to(self.x0.dtype)

    def set_t(self, rows: torch.Tensor, t: torch.Tensor) -> None:
        """Move the rows ``rows`` (one) to the step size ``t`` and load it."""
        if rows.numel() == 0:
            return
        self.t[rows.cpu()] = t.to(self.t)
        self._load(self._one(rows))

    def _one(self, rows: torch.Tensor) -> int:
        rs = set(rows.tolist())
        if len(rs) != 1:
            raise ValueError(f"InPlace evaluates one row at a time, got rows {sorted(rs)[:4]}")
        return rs.pop()

    def map(self, name: str, rows: torch.Tensor, *args):
        """``model.<name>`` of the row ``rows`` (one) at its parameters (loaded first where another row is in)."""
        r = self._one(rows)
        if r != self.current:
            self._load(r)
        self.calls += 1
        return getattr(self.model, name)(*args)

    def step(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The loop map of the row ``rows`` at its parameters: step(x_r, x0_r) (x0_r: the embedding at them)."""
        r = self._one(rows)
        if r != self.current:
            self._load(r)
        return self.map("step", rows, x, self.x0[rows])

    def close(self) -> None:
        self.theta.restore()
        self.current = None
