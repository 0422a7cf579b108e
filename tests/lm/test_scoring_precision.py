"""LM scoring with the ignore index (next-token targets, loss and perplexity against torch's cross entropy,
per-token accuracy, a sample with nothing scored), structured inputs (pack / unpack, context channels, masks), and
precision: float64_mode turns a model's float32 casts into float64 under torch.func, the audit names the casts of a
model that computes below float64, and the refusal and the failure hint name precision."""

import copy
import math

import pytest
import torch
from torch.nn import functional as F

from stability.errors import StabilityError
from stability.lm import (IGNORE_INDEX, check_float64, float64_mode, lm_score, next_token_targets, pack,
                          precision_audit, score_lm, token_accuracy, token_losses, unpack)
from stability.lm.inputs import POSITION_SCALE, attention_bias, split_context, with_context
from stability.lm.precision import precision_hint


def test_next_token_targets_ignore_the_last_position_and_pads():
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 3, 4], [1, 2, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0]])
    X = IGNORE_INDEX
    assert next_token_targets(ids, mask).tolist() == [[6, 7, 8, X], [X, X, 4, X], [2, X, X, X]]


def test_scores_ignore_minus_100_and_agree_with_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g, dtype=torch.float64)
    targets = logits.argmax(-1).clone()
    targets[0, 3] = IGNORE_INDEX
    targets[1, 0] = (targets[1, 0] + 1) % 7  # one wrong
    targets[1, 3] = IGNORE_INDEX
    correct, acc = lm_score(logits, targets)
    assert correct.tolist() == [True, False] and acc.tolist() == pytest.approx([1.0, 2 / 3])
    assert token_accuracy(logits, targets) == pytest.approx(5 / 6)
    s = score_lm(logits, targets)
    ref = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    assert s["loss"] == pytest.approx(float(ref), rel=1e-12) and s["perplexity"] == pytest.approx(math.exp(ref))
    assert s["scored_tokens"] == 6 and s["sequence_accuracy"] == 0.5
    assert float(token_losses(logits, targets)[0, 3]) == 0.0
    nothing = torch.full((1, 4), IGNORE_INDEX)
    assert lm_score(logits[:1], nothing)[0].tolist() == [True] and token_accuracy(logits[:1], nothing) is None


def test_pack_unpack_and_the_context_channels_round_trip():
    ids = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    lm = unpack(pack(ids, mask))
    assert lm.positions.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]] and lm.mask.tolist() == mask.bool().tolist()
    plain = unpack(ids)
    assert plain.mask.all() and plain.positions[0].tolist() == [0, 1, 2, 3, 4]
    h = torch.randn(2, 5, 3, dtype=torch.float32)
    pos = torch.tensor([[0, 1, 2, 70000, 2 ** 20], [0] * 5])
    h2, m2, p2 = split_context(with_context(h, lm.mask, pos))
    assert torch.equal(h2, h) and torch.equal(m2, lm.mask) and torch.equal(p2, pos)
    assert float(with_context(h, lm.mask, pos)[0, 3, -1]) == 70000 * POSITION_SCALE
    for bad in (torch.randn(2, 5), torch.zeros(2, 4, 5, dtype=torch.long)):
        with pytest.raises(StabilityError, match="token ids"):
            unpack(bad)
    with pytest.raises(StabilityError, match="at least one real token"):
        pack(ids, torch.zeros_like(mask))


def test_the_attention_mask_sees_real_earlier_tokens_in_the_window_and_itself():
    mask = torch.tensor([[False, True, True, True]])
    allowed = attention_bias(mask, torch.float32, window=2)[0, 0] == 0
    assert allowed.tolist() == [[True, False, False, False],  # a pad query sees itself only
                                [False, True, False, False],
                                [False, True, True, False],
                                [False, False, True, True]]  # window 2: q − k < 2


class Casts(torch.nn.Module):
    """A float64 loop map that computes its norm in float32, as language models do."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(0.5 * torch.eye(3, dtype=torch.float64))

    def embed(self, inputs):
        return inputs.double()

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return torch.softmax(h, -1, dtype=torch.float32).to(x.dtype) @ self.W + x0

    def readout(self, x):
        return x


def test_float64_mode_makes_every_cast_float64_under_torch_func():
    m = Casts()
    x = torch.randn(2, 3, dtype=torch.float64)
    assert precision_audit(m, x) == {"Tensor.float -> float32": 1}  # the cast, not what follows it
    with pytest.raises(StabilityError, match="computes in lower precision.*float64_mode"):
        check_float64(m, x)
    with float64_mode():
        y = m.step(x, x)
        _, t = torch.func.jvp(lambda u: m.step(u, x), (x,), (torch.ones_like(x),))
        basis = torch.eye(3, dtype=torch.float64)[:, None].expand(3, 2, 3)
        cols = torch.func.vmap(lambda v: torch.func.jvp(lambda u: m.step(u, x), (x,), (v,))[1])(basis)
    assert y.dtype == t.dtype == cols.dtype == torch.float64
    ref = F.softmax(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), -1) @ m.W + x
    assert torch.allclose(y, ref, rtol=1e-15, atol=1e-15)  # float64 to the last bits, not float32 rounding
    assert not torch.allclose(m.step(x, x), ref, rtol=1e-12, atol=0)


def test_a_failure_of_a_model_below_float64_names_precision():
    msg = "GMRES did not converge: relative residual 0.001 > tol 1e-10 after 60 products with I − J (is x* " \
          "attracting, ρ(J) < 1?)"
    hint = precision_hint(StabilityError(msg), Casts(), torch.randn(1, 3, dtype=torch.float64))
    assert "cause: precision, not the model: its step computes in lower precision (Tensor.float" in hint
    assert "is x* attracting" not in hint
    assert "the model is float32" in precision_hint(StabilityError(msg), Casts().float(), torch.randn(1, 3))
    ok = Casts()
    ok.step = lambda x, x0: x @ ok.W + x0
    assert precision_hint(StabilityError(msg), ok, torch.randn(1, 3, dtype=torch.float64)) == msg


def test_an_inputs_file_with_hugging_face_labels_or_aligned_targets(tmp_path):
    from stability.lm.inputs import load_inputs

    ids = torch.tensor([[5, 6, 7, 8], [0, 3, 4, 9]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, IGNORE_INDEX))
    torch.save({"input_ids": ids, "attention_mask": mask, "labels": labels}, tmp_path / "a.pt")
    packed, targets = load_inputs(tmp_path / "a.pt")
    assert torch.equal(packed, pack(ids, mask))
    assert torch.equal(targets, next_token_targets(ids, mask))  # HF labels, shifted: the next tokens
    torch.save({"input_ids": ids, "targets": targets}, tmp_path / "b.pt")
    assert torch.equal(load_inputs(tmp_path / "b.pt")[1], targets)
    torch.save(ids, tmp_path / "c.pt")
    assert load_inputs(tmp_path / "c.pt")[1] is None
    torch.save({"input_ids": ids, "labels": labels, "targets": targets}, tmp_path / "d.pt")
    with pytest.raises(StabilityError, match="not both"):
        load_inputs(tmp_path / "d.pt")


def test_a_plain_models_score_leaves_ignore_index_targets_out():
    """stability.analysis.accuracy.argmax_score (a model of one's own, score=None): −100 positions are not scored,
    against counting by hand; without −100 the tasks' rule is unchanged."""
    from stability.analysis.accuracy import argmax_score

    logits = torch.zeros(3, 4, 5)
    pred = torch.tensor([[0, 1, 2, 3], [4, 4, 4, 4], [1, 1, 1, 1]])
    logits.scatter_(-1, pred.unsqueeze(-1), 1.0)
    targets = torch.tensor([[0, 1, -100, -100], [4, 0, 4, -100], [-100, -100, -100, -100]])
    correct, acc = argmax_score(logits, targets)
    assert correct.tolist() == [True, False, True]
    assert acc.tolist() == pytest.approx([1.0, 2 / 3, 1.0])
    plain = torch.tensor([[0, 1, 2, 0], [4, 4, 4, 4], [1, 0, 1, 1]])
    correct, acc = argmax_score(logits, plain)
    assert correct.tolist() == [False, True, False] and acc.tolist() == pytest.approx([0.75, 1.0, 0.75])


class Mixer(torch.nn.Module):
    """A plain (not LM) looped model: x ← x/2 + tanh(A x + x0 + mean over positions), read out by a linear map."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.A = torch.nn.Parameter(0.3 * torch.randn(6, 6, generator=g))
        self.emb = torch.nn.Parameter(torch.randn(1, 6, generator=g))
        self.out = torch.nn.Parameter(torch.randn(6, 3, generator=g))

    def embed(self, inputs):
        return inputs.unsqueeze(-1) * self.emb

    def initial_state(self, x0, generator=None):
        return torch.zeros_like(x0)

    def step(self, x, x0):
        return 0.5 * x + torch.tanh(x @ self.A.T + x0 + x.mean(dim=1, keepdim=True))

    def readout(self, x):
        return x @ self.out


def test_a_plain_models_analysis_scores_only_the_targets_that_are_not_ignored():
    """stability.analyze on a model of one's own whose targets carry −100: the accuracy at x* is that of the
    scored positions, counted by hand from readout(x*)."""
    import stability
    from stability.config import AnalysisOptions

    m = Mixer()
    inputs = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    a = stability.analyze(m, inputs, torch.zeros(4, 5, dtype=torch.long),
                          options=AnalysisOptions(samples=4, stages=("reachability", "accuracy"), max_iter=200))
    split = a.splits["inputs"]
    pred = m.double().readout(split.x_star.to(torch.float64)).argmax(-1)
    targets = pred.clone()
    targets[:, 2:] = -100
    targets[0, 0] = (pred[0, 0] + 1) % 3  # sample 0 has one scored position wrong
    targets[1, :] = -100  # sample 1: nothing scored, so nothing wrong
    a = stability.analyze(Mixer(), inputs, targets,
                          options=AnalysisOptions(samples=4, stages=("reachability", "accuracy"), max_iter=200))
    assert a["inputs"]["accuracy"]["at_fixed_point"] == pytest.approx(3 / 4)


def _linear_prop5(dtype, scale):
    """Prop. 5's check on f(x, x0) = A x + x0 with ρ(A) = ``scale``, its products in ``dtype``, GMRES asked for
    a relative residual of 1e-12."""
    from stability.analysis.prop5 import prop5_check_batched

    g = torch.Generator().manual_seed(0)
    A = torch.randn(24, 24, generator=g, dtype=torch.float64)
    A = (scale * A / torch.linalg.eigvals(A).abs().max()).to(dtype)
    x0 = torch.randn(1, 24, generator=g, dtype=torch.float64).to(dtype)

    def f(x, x0):
        return x @ A.T + x0

    x_star = torch.linalg.solve(torch.eye(24, dtype=torch.float64) - A.double(), x0.double().T).T.to(dtype)
    return prop5_check_batched(f, x_star, x0, torch.zeros_like(x0), [1, 2], tol=1e-12, max_iter=48)


def test_a_gmres_failure_at_float32_names_precision_not_attraction():
    """The same contracting map (ρ = 0.5): in float64 GMRES reaches 1e-12; in float32 it cannot (ε ≈ 1.2e-7), and
    the message says precision and float32, not 'is x* attracting?'; a repelling map (ρ = 1.5, float64) keeps
    the attraction hint."""
    from stability.analysis.prop5 import KrylovError

    assert _linear_prop5(torch.float64, 0.5).sample(0).gmres_residual <= 1e-11
    with pytest.raises(KrylovError) as err:
        _linear_prop5(torch.float32, 0.5).sample(0)
    assert "precision" in str(err.value) and "float32" in str(err.value) and "attracting" not in str(err.value)
    assert precision_hint(err.value, torch.nn.Linear(2, 2), torch.zeros(1, 2)) == str(err.value)  # said once


def test_a_cast_copy_equals_deepcopy_then_cast_and_keeps_ties():
    """stability.analysis.fixed_point.cast_copy (the analysis copy, stage rho's float32 copy): the tensors of
    ``copy.deepcopy(m).to(dtype)``, tied weights still tied, nothing shared with the original."""
    from stability.analysis.fixed_point import cast_copy

    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 3))
    m[2].weight = m[0].weight
    m[0].weight.requires_grad_(False)
    c = cast_copy(m, torch.float64)
    ref = copy.deepcopy(m).to(torch.float64)
    assert all(torch.equal(a, b) and a.dtype == torch.float64 for a, b in zip(c.state_dict().values(),
                                                                             ref.state_dict().values()))
    assert [p.requires_grad for p in c.parameters()] == [p.requires_grad for p in m.parameters()]
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(c.parameters(), m.parameters()))
    assert m[0].weight.dtype == torch.float32  # the original is untouched
    assert c[2].weight is c[0].weight
