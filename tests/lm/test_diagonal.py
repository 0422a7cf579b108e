"""The diagonal blocks of a causal J* in one forward-mode pass (stability/lm/diagonal.py): for the reference Huginn
and the tiny HRM-Text and Inkling-2 Loop models, the one-pass product equals the per-position route's and the dense
diagonal blocks of ``token_blocks`` to 1e-10, the per-token ρ by it equals the per-position route's to 1e-12, and
a step with a position-coupling op the context does not know (a cumsum over tokens) falls back to the per-position
answer."""

import contextlib
import math

import pytest
import torch

from stability.lm import diagonal, pack
from stability.lm.tokens import one_pass_apply, per_position_apply, token_blocks, token_spectra
from tests.lm.conftest import T, float64, ids, padded_mask
from tests.lm.test_tokens import fixed_point, huginn


def _models():
    """(name, model, x, x0): Huginn at its x*; HRM-Text and Inkling-2 Loop at a state two passes from e (any point
    has a J), each on a padded batch."""
    m = huginn(contractive=False)
    x0, xs = fixed_point(m, pack(ids(), padded_mask()))
    out = [("huginn", m, xs, x0)]
    try:
        import transformers  # noqa: F401
    except ImportError:
        return out
    from stability.lm import HrmTextAdapter, InklingLoopAdapter
    from tests.lm.conftest import hrm_model, inkling_model

    for name, a in (("inkling", InklingLoopAdapter(inkling_model())), ("hrm", HrmTextAdapter(hrm_model()))):
        m = float64(a)
        x0 = m.embed(pack(ids(2), padded_mask(2)))
        out.append((name, m, m.step(m.step(m.initial_state(x0), x0), x0), x0))
    return out


MODELS = _models()


def _products(m, x, x0, V):
    """(one-pass, per-position, dense blocks) products of the real tokens' diagonal blocks with V (P, D)."""
    D, real = m.dynamic_channels, m.token_mask(x0)
    acausal = torch.zeros(x.shape[0], dtype=x.dtype)
    per = per_position_apply(m.step, x, x0, D, real, acausal, chunk=3)(V)
    one = one_pass_apply(m.step, x, x0, D, real, m.diagonal_tangents)(V)
    blocks, _ = token_blocks(m.step, x, x0, D)
    return one, per, torch.einsum("pij,pj->pi", blocks[real], V)


@pytest.mark.parametrize("name,m,x,x0", MODELS, ids=[c[0] for c in MODELS])
def test_one_pass_product_is_the_per_position_and_the_dense_blocks_product(name, m, x, x0):
    P = int(m.token_mask(x0).sum())
    V = torch.randn(P, m.dynamic_channels, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    one, per, dense = _products(m, x, x0, V)
    assert float(per.norm()) > 1.0  # the blocks are not trivially zero
    assert float((one - per).norm() / per.norm()) <= 1e-10
    assert float((one - dense).norm() / dense.norm()) <= 1e-10


@pytest.mark.parametrize("name,m,x,x0", MODELS, ids=[c[0] for c in MODELS])
def test_the_context_leaves_the_step_value_bit_for_bit(name, m, x, x0):
    with m.diagonal_tangents():
        y = m.step(x, x0)
    assert torch.equal(y, m.step(x, x0))


@pytest.mark.parametrize("name,m,x,x0", MODELS, ids=[c[0] for c in MODELS])
def test_per_token_rho_by_one_pass_is_the_per_position_rho(name, m, x, x0):
    one = token_spectra(m, x, x0, method="krylov", positions=3)
    per = token_spectra(m, x, x0, method="krylov", positions=3, one_pass=False)
    assert one.route["route"] == "one-pass" and one.route["check_rel_diff"] <= 1e-10
    assert per.route["route"] == "per-position" and "turned off" in per.route["note"]
    real = m.token_mask(x0)
    rel = (one.token_rho[real] - per.token_rho[real]).abs() / per.token_rho[real]
    assert float(rel.max()) <= 1e-12
    assert torch.equal(one.bottleneck, per.bottleneck) and one.exact.all()
    blocks = token_spectra(m, x, x0, method="blocks")
    assert torch.allclose(one.token_rho[real], blocks.token_rho[real], rtol=0, atol=1e-9)


def test_inkling_needs_its_convolutions_diagonal_too():
    """The attention-only context is not enough for Inkling-2 Loop (its short convolutions couple positions): the
    product differs, which is what the check guards against."""
    pytest.importorskip("transformers")
    from transformers.models.inkling2_loop import modeling_inkling2_loop as hf

    name, m, x, x0 = next(c for c in MODELS if c[0] == "inkling")
    D, real = m.dynamic_channels, m.token_mask(x0)
    V = torch.randn(int(real.sum()), D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    attention = diagonal.eager_attention(hf.eager_attention_forward, hf.repeat_kv, lambda mod: mod.is_causal)
    context = lambda: diagonal.patched((hf, {"eager_attention_forward": attention}))  # noqa: E731
    only = one_pass_apply(m.step, x, x0, D, real, context)(V)
    per = per_position_apply(m.step, x, x0, D, real, torch.zeros(2, dtype=torch.float64))(V)
    assert float((only - per).norm() / per.norm()) > 1e-3


class Toy(torch.nn.Module):
    """x' = tanh(W x + attention(x) + c · cumsum_t x / (t + 1)) + x0 per token (D = 6, 2 heads, causal), the
    attention by ``sdpa`` or written out (as the reference Huginn: its diagonal rule under the flag); ``c`` ≠ 0
    adds a coupling of positions no context knows."""

    dynamic_channels, causal = 6, True

    def __init__(self, sdpa=False, c=0.0, context=diagonal.tangent_mode):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.W, self.Q = (0.4 * torch.randn(6, 6, generator=g, dtype=torch.float64) for _ in range(2))
        self.K, self.Vw = (0.8 * torch.randn(6, 6, generator=g, dtype=torch.float64) for _ in range(2))
        self.sdpa, self.c, self.context = sdpa, c, context

    def attention(self, x):
        B, n, _ = x.shape
        q, k, v = ((x @ M.T).view(B, n, 2, 3).transpose(1, 2) for M in (self.Q, self.K, self.Vw))
        if self.sdpa:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            causal = torch.full((n, n), float("-inf"), dtype=x.dtype).triu(1)
            w = torch.softmax(q @ diagonal.cut(k).transpose(-1, -2) / math.sqrt(3) + causal, dim=-1)
            o = diagonal.attention_diagonal(w @ diagonal.cut(v), w, q, k, v, 1 / math.sqrt(3))
        return o.transpose(1, 2).reshape(B, n, 6)

    def step(self, x, x0):
        mix = torch.cumsum(x, dim=1) / torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return torch.tanh(x @ self.W.T + self.attention(x) + self.c * mix) + x0

    def diagonal_tangents(self):
        return None if self.context is None else self.context()


def test_sdpa_diagonal_mode_gives_the_explicit_attentions_blocks():
    """A step written with scaled_dot_product_attention (no forward-mode rule on the CPU) under SdpaDiagonal: the
    one-pass product equals the dense blocks of the same step with the attention written out."""
    x0 = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    real = torch.ones(2, 5, dtype=torch.bool)
    V = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    one = one_pass_apply(Toy(sdpa=True).step, x, x0, 6, real, diagonal.SdpaDiagonal)(V)
    blocks, acausal = token_blocks(Toy().step, x, x0, 6)
    dense = torch.einsum("pij,pj->pi", blocks[real], V)
    assert float(acausal.max()) == 0.0 and float((one - dense).norm() / dense.norm()) <= 1e-10
    with diagonal.SdpaDiagonal():
        y = Toy(sdpa=True).step(x, x0)
    assert torch.allclose(y, Toy().step(x, x0), rtol=0, atol=1e-14)


def test_an_unknown_position_coupling_op_falls_back_to_the_per_position_answer():
    """A cumsum over tokens under a context that knows attention only: the check sees the one-pass product differ
    and the per-token ρ is the per-position route's; a model without a context takes that route, said so."""
    x0 = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    toy = Toy(c=0.7)
    got = token_spectra(toy, x, x0, method="krylov", positions=2)
    assert got.route["route"] == "per-position" and got.route["check_rel_diff"] > 1e-3
    assert "differed" in got.route["note"]
    ref = token_spectra(toy, x, x0, method="krylov", positions=2, one_pass=False)
    assert torch.equal(got.token_rho, ref.token_rho)
    blocks = token_spectra(toy, x, x0, method="blocks")
    assert torch.allclose(got.token_rho, blocks.token_rho, rtol=0, atol=1e-9)
    unknown = token_spectra(Toy(c=0.7, context=None), x, x0, method="krylov", positions=2)
    assert unknown.route["note"].startswith("no one-pass context") and torch.equal(unknown.token_rho, ref.token_rho)
    known = token_spectra(Toy(), x, x0, method="krylov", positions=2)
    assert known.route["route"] == "one-pass"


def test_a_context_that_fails_falls_back_to_the_per_position_answer_and_says_why():
    @contextlib.contextmanager
    def failing():  # a context whose products raise (entering it, here)
        raise RuntimeError("no forward-mode rule here")
        yield

    x0 = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got = token_spectra(Toy(context=failing), x, x0, method="krylov", positions=2)
    assert got.route["route"] == "per-position" and got.route["check_rel_diff"] is None
    assert "RuntimeError: no forward-mode rule here" in got.route["note"]
    ref = token_spectra(Toy(), x, x0, method="krylov", positions=2, one_pass=False)
    assert torch.equal(got.token_rho, ref.token_rho)
