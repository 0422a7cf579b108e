"""LM scoring with the ignore index (next-token targets, loss and perplexity against torch's cross entropy,
per-token accuracy, a sample with nothing scored), structured inputs (pack / unpack, context channels, masks), and
precision: float64_mode turns a model's float32 casts into float64 under torch.func, the audit names the casts of a
model that computes below float64, and the refusal and the failure hint name precision."""

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
