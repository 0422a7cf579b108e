"""Routing discontinuities (a router whose choice flips every pass: counted per sample, per token, and the state's
period-2 orbit found; Inkling's routers hooked), and the exit-rule audit (each rule's exit pass, compute spent and
agreement with the last pass)."""

import pytest
import torch

from stability.lm import audit_exits, exit_trace, routing_changes
from stability.lm.exits import ExitTrace, exit_passes
from tests.lm.conftest import float64, ids, padded_mask


class Router(torch.nn.Module):
    """Top-1 of two experts by the sign of the first feature, returning (logits, weights, indices) like Inkling's."""

    top_k = 1

    def forward(self, h):
        logits = torch.stack([h[..., 0], -h[..., 0]], dim=-1)
        idx = logits.argmax(-1, keepdim=True)
        return logits, torch.ones_like(idx, dtype=h.dtype), idx


class Flipper(torch.nn.Module):
    """x' = −x on the tokens routed to expert 0 or 1 alike: a period-2 orbit whose routing flips every pass; token 0
    of every sequence is held at 0.5 (routed the same way every pass)."""

    dynamic_channels = 2

    def __init__(self):
        super().__init__()
        self.router = Router()

    def routers(self):
        return [("router", self.router)]

    def token_mask(self, x0):
        return torch.ones(x0.shape[:2], dtype=torch.bool)

    def step(self, x, x0):
        self.router(x)
        y = -x
        return torch.cat([torch.full_like(y[:, :1], 0.5), y[:, 1:]], dim=1)


def test_a_router_flipping_every_pass_is_counted_and_the_period_two_orbit_found():
    m = Flipper()
    x = torch.tensor([[[0.5, 1.0], [1.0, 2.0], [-2.0, 1.0]]], dtype=torch.float64)
    rc = routing_changes(m, x, x, iterates=6)
    assert rc.token_changes.tolist() == [[0, 5, 5]] and rc.changes.tolist() == [10]
    assert rc.alternating.tolist() == [2] and rc.period2.tolist() == [True]
    assert rc.margin[0].tolist() == pytest.approx([1.0, 2.0, 4.0])  # |2 h0|: the gap between the two scores
    assert routing_changes(torch.nn.Linear(2, 2), x, x) is None  # no routers: nothing to count


def test_inkling_routers_are_hooked_and_pads_not_counted():
    pytest.importorskip("transformers")
    from stability.lm import InklingLoopAdapter
    from stability.lm import pack
    from tests.lm.conftest import inkling_model

    m = float64(InklingLoopAdapter(inkling_model()))
    x0 = m.embed(pack(ids(), padded_mask()))
    x = m.initial_state(x0)
    rc = routing_changes(m, x0, x, iterates=5)
    assert rc.routers == ["layers.1.mlp.gate", "layers.2.mlp.gate"]
    assert rc.changes.shape == (3,) and rc.token_changes.shape == (3, 8)
    assert int(rc.token_changes[0, :3].sum()) == 0 and torch.isnan(rc.margin[0, :3]).all()
    assert bool((rc.margin[2] >= 0).all())


def _trace(argmax, kl):
    N, T = len(argmax), len(argmax[0])
    z = torch.zeros(N, 1, T, dtype=torch.float64)
    return ExitTrace(kl=torch.tensor(kl, dtype=torch.float64)[:, None], entropy=z, latent=z, cosine=z, residual=z,
                     argmax=torch.tensor(argmax)[:, None], mask=torch.ones(1, T, dtype=torch.bool))


def test_exit_passes_and_the_audit_on_a_known_trace():
    # two tokens over 5 passes: token 0's answer settles at pass 3, token 1's changes at the last pass
    tr = _trace(argmax=[[1, 4], [2, 4], [3, 4], [3, 4], [3, 5]],
                kl=[[1.0, 1e-6], [1.0, 1e-6], [1e-3, 1e-6], [1e-6, 1e-6], [1e-6, 1.0]])
    assert exit_passes(tr, "kl", 1e-2).tolist() == [[3, 1]]
    assert exit_passes(tr, "kl", 1e-9).tolist() == [[5, 5]]  # never fires: the last pass
    assert exit_passes(tr, "argmax", 2).tolist() == [[4, 2]]  # two equal answers in a row
    audit = audit_exits(tr, {"kl": (1e-2,), "argmax": (2,)}, targets=torch.tensor([[3, 5]]))
    kl, am = audit["rules"]
    assert kl["mean_exit"] == 2.0 and kl["compute"] == pytest.approx(0.4) and kl["fired"] == 1.0
    assert kl["agreement"] == 0.5 and kl["accuracy_at_exit"] == 0.5  # token 1 exited before its answer changed
    assert am["mean_exit"] == 3.0 and audit["full_depth_accuracy"] == 1.0


def test_the_audit_of_a_converging_model():
    from stability.lm import pack
    from stability.lm.huginn import tiny

    m = float64(tiny(vocab_size=48))
    with torch.no_grad():
        m.adapter.weight[:, :32] *= 0.3
    x0 = m.embed(pack(ids(), padded_mask()))
    tr = exit_trace(m, x0, m.initial_state(x0), passes=40)
    assert tr.kl.shape == (40, 3, 8) and bool((tr.kl[-1][tr.mask] < 1e-12).all())
    audit = audit_exits(tr, {"kl": (1e-3, -1.0), "residual": (1e-6,)})  # -1: never fires
    loose, never, res = audit["rules"]
    assert audit["tokens"] == 19 and never["compute"] == 1.0 and never["agreement"] == 1.0
    assert loose["compute"] < res["compute"] < 1.0
    assert res["agreement"] == 1.0  # settled to 1e-6: the full-depth answer
