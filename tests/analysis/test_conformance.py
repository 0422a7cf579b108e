"""Conformance: the whole analysis (``stability.analyze`` and ``stability analyze --model``) on models of every
kind that satisfies the LoopedModel contract — our LoopedTransformer (all 15 recall × norm combinations), the
MixerLoop of notebook 03, a toy recall model exposing the named parts, a DEQ in plain torch, and a TRM-style model
whose two-tensor carry (y, z) is packed into one state — with numbers checked against independent references:
ρ(J*) against the dense Jacobian (torch.func.jacrev + numpy eigvals), Prop. 4 against autograd, accuracy against
a hand computation, and the verdict against its own numbers and thresholds.
"""

import json
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

import stability
from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import DEFAULT_STAGES, STAGES, AnalysisOptions
from stability.analysis.recall import RecallMatrixOperator
from stability.config import ModelConfig
from stability.errors import StabilityError
from stability.model import build_model
from stability.protocols import LoopedModel, RecallParts, check_model, has_recall_parts, is_looped

L = 6  # tokens
FAST = dict(max_iter=60, iterations=4, probes=2, eig_precision="float64", eig_tol=1e-8)


def dense_rho(model, x, x0) -> float:
    """ρ of ∂step/∂x at one sample, from the dense autograd Jacobian and numpy's eigvals (the reference)."""
    J = torch.func.jacrev(lambda t: model.step(t.unsqueeze(0), x0.unsqueeze(0))[0])(x)
    n = x.numel()
    return float(np.abs(np.linalg.eigvals(J.reshape(n, n).numpy())).max())


def assert_rho_matches_dense(analysis, model):
    m = analysis_model(model)
    rhos = analysis["inputs"]["jacobian"]["spectral_radius"]
    split = analysis.splits["inputs"]  # the tensors the numbers were computed at
    for b in range(split.samples):
        ref = dense_rho(m, split.x_star[b], split.x0[b])
        assert abs(rhos[b] - ref) < 1e-6 * max(1.0, ref), (b, rhos[b], ref)


def assert_verdict_consistent(block):
    """The verdict's numbers are the blocks' numbers, and its words follow from them and the stated thresholds."""
    v, fp = block["verdict"], block["fixed_point"]
    nums, th = v["numbers"], v["thresholds"]
    assert nums["converged_fraction"] == fp["converged_fraction"]
    rho = block["jacobian"]["spectral_radius_median"] if block["jacobian"] else None
    assert nums["rho_J_median"] == rho
    if rho is not None:
        assert nums["rho_margin"] == pytest.approx(1 - rho)
    share = fp["converged_fraction"]
    if share == 0 or (rho is not None and rho >= 1 - th["rho_margin"]):
        assert v["reachable"] == "no"
    elif rho is not None:  # the rule (docs/analysis.md, "The verdict's rule"), computed here from scipy directly
        from scipy.stats import binomtest

        n = len(fp["status"])
        ci = binomtest(round(share * n), n).proportion_ci(confidence_level=0.9, method="wilson")
        rho_hi = v["intervals"]["rho_J_median"]["hi"]
        share_word = "yes" if ci.low >= th["reachable_share"] else "no" if ci.high < th["reachable_share"] else "partly"
        rho_word = "yes" if rho_hi is not None and rho_hi < 1 - th["rho_margin"] else "partly"
        words = {share_word, rho_word}
        assert v["reachable"] == ("no" if "no" in words else "yes" if words == {"yes"} else "partly")
    g = (block["input_dependence"] or {}).get("frobenius_median")
    assert nums["input_grad_median"] == g
    if g is not None and g < th["input_grad_min"]:
        assert v["input_dependent"] == "no"
    d = (block["initial_iterate"] or {}).get("fixed_point_distance_max")
    assert nums["e_distance_max"] == d
    glo = (block["initial_iterate"] or {}).get("global")
    if glo is not None and glo["compared"]:  # from every start: a fact of the reachable line, not an axis
        # decided by the global comparison (basins, converged starts only), A.8's local numbers said beside it
        assert (v["from_every_start"] == "no") == (glo["differ"] > 0)
        assert nums["e_global_differ"] == glo["differ"]
        assert "from every start:" in v["reasons"]["reachable"] and "local (A.8)" in v["reasons"]["reachable"]
        if d is not None and d > th["e_distance_max"]:
            assert v["from_every_start"] == "no"
    for axis in ("reachable", "input_dependent", "geometry"):
        assert v[axis] in ("yes", "no", "partly", "not measured")
    assert "independent_of_e" not in v


def hand_accuracy(model, inputs, targets, T):
    """Whole-answer and per-position accuracy of argmax(readout(x_t)), t = 1..T, by plain iteration (float64)."""
    m = analysis_model(model)
    with torch.no_grad():
        x0 = m.embed(inputs.double() if inputs.is_floating_point() else inputs)
        x = m.initial_state(x0)
        whole, pos = [], []
        for _ in range(T):
            x = m.step(x, x0)
            right = (m.readout(x).argmax(-1) == targets).reshape(targets.shape[0], -1).double()
            whole.append(float(right.min(1).values.mean()))
            pos.append(float(right.mean(1).mean()))
    return whole, pos


# ---- the models ------------------------------------------------------------------------------------------------

class MixerLoop(nn.Module):
    """Notebook 03's model: x_{t+1} = x/2 + tanh(A x + B x0 + mean-over-tokens(C x)), with a readout."""

    def __init__(self, d=8, scale=0.4, classes=3):
        super().__init__()
        self.embed_in = nn.Linear(1, d)
        self.A = nn.Linear(d, d)
        self.B = nn.Linear(d, d, bias=False)
        self.C = nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, classes)
        with torch.no_grad():
            for lin in (self.A, self.C):
                lin.weight.mul_(scale / torch.linalg.matrix_norm(lin.weight, ord=2))

    def embed(self, inputs):
        return self.embed_in(inputs)

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        mix = self.C(x).mean(dim=1, keepdim=True)
        return 0.5 * x + torch.tanh(self.A(x) + self.B(x0) + mix)

    def readout(self, x):
        return self.out(x)


class ToyRecall(nn.Module):
    """A recall model that is not ours, written through the named parts of Defs. 5.1 / 5.2 (RecallParts): a
    token-mixing first sublayer, a gated residual, a bounded outer normalisation, optional damping."""

    def __init__(self, recall="internal", d=6, damping=1.0, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.recall, self.d = recall, d
        self.inp = nn.Linear(2, d)
        self.Wx, self.W0 = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.F1, self.F2 = nn.Linear(d, d), nn.Linear(d, d)
        self.gate = nn.Parameter(torch.tensor([0.3, 0.6]))
        self.head = nn.Linear(d, 2)
        self.variant_options = {"damping": damping} if damping != 1.0 else {}
        self.has_outer_norm = True
        with torch.no_grad():
            for lin in (self.Wx, self.F1, self.F2):
                lin.weight.mul_(0.5 / torch.linalg.matrix_norm(lin.weight, ord=2))

    @property
    def W_x(self):
        return self.Wx.weight

    def g(self, x, x0):
        return self.Wx(x) + self.W0(x0)

    def pre(self, s, u):
        return u / torch.sqrt(1.0 + u.pow(2).mean(-1, keepdim=True))

    def h(self, s, v):
        if s == 1:
            return torch.tanh(self.F1(v) + v.mean(dim=1, keepdim=True))
        return torch.tanh(self.F2(v))

    def residual(self, s, u, v):
        a = torch.sigmoid(self.gate[s - 1] + 0.1 * u)  # a state-dependent gate: ∂_u R is not a multiple of I
        return (1 - a) * u + a * v

    def phi(self, s, u):
        return u / torch.sqrt(1.0 + 0.1 * u.pow(2).mean(-1, keepdim=True))

    def embed(self, inputs):
        return self.inp(inputs)

    def initial_state(self, x0, generator=None):
        return x0

    def _undamped(self, x, x0):
        if self.recall == "internal":
            z = self.phi(1, self.residual(1, x, self.h(1, self.g(self.pre(1, x), x0))))
            return self.phi(2, self.residual(2, z, self.h(2, self.g(self.pre(2, z), x0))))
        u = self.g(x, x0) if self.recall == "external" else x
        z = self.phi(1, self.residual(1, u, self.h(1, self.pre(1, u))))
        return self.phi(2, self.residual(2, z, self.h(2, self.pre(2, z))))

    def step(self, x, x0):
        eta = self.variant_options.get("damping", 1.0)
        fx = self._undamped(x, x0)
        return fx if eta == 1.0 else (1 - eta) * x + eta * fx

    def readout(self, x):
        return self.head(x)


class DEQ(nn.Module):
    """A deep-equilibrium model in plain torch: z* = tanh(W z* + U x0 + b) on a flat vector state (B, n)."""

    def __init__(self, inp=4, n=12, classes=3, gain=0.6):
        super().__init__()
        self.U = nn.Linear(inp, n)
        self.W = nn.Linear(n, n, bias=False)
        self.out = nn.Linear(n, classes)
        with torch.no_grad():
            self.W.weight.mul_(gain / torch.linalg.matrix_norm(self.W.weight, ord=2))

    def embed(self, inputs):
        return self.U(inputs)

    def initial_state(self, x0, generator=None):
        return torch.zeros_like(x0)

    def step(self, z, x0):
        return torch.tanh(self.W(z) + x0)

    def readout(self, z):
        return self.out(z)


class TRMStyle(nn.Module):
    """A TRM-style model with a two-part carry: the latent z and the answer y, packed as x = cat([y, z], -1).

    One step: z ← z/2 + tanh(A z + B y + C x0)/2, then y ← y/2 + tanh(D y + E z)/2; x0 (B, L, d), x (B, L, 2d)."""

    def __init__(self, d=4, classes=2):
        super().__init__()
        self.d = d
        self.inp = nn.Linear(1, d)
        self.A, self.B, self.C = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.D, self.E = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, classes)

    @staticmethod
    def pack(y, z):
        return torch.cat([y, z], -1)

    def unpack(self, x):
        return x[..., :self.d], x[..., self.d:]

    def embed(self, inputs):
        return self.inp(inputs)

    def initial_state(self, x0, generator=None):
        return torch.zeros(*x0.shape[:-1], 2 * self.d, dtype=x0.dtype, device=x0.device)

    def step(self, x, x0):
        y, z = self.unpack(x)
        z = 0.5 * z + 0.5 * torch.tanh(self.A(z) + self.B(y) + self.C(x0) + z.mean(1, keepdim=True))
        y = 0.5 * y + 0.5 * torch.tanh(self.D(y) + self.E(z))
        return self.pack(y, z)

    def readout(self, x):
        return self.out(self.unpack(x)[0])


def bits(n, seed=0, channels=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n, L, channels), generator=g).float() - 0.5


# ---- the LoopedTransformer, every recall × norm ---------------------------------------------------------------

@pytest.mark.parametrize("norm", ["none", "pre", "peri", "post", "gru"])
@pytest.mark.parametrize("recall", ["none", "external", "internal"])
def test_the_looped_transformer_conforms_in_every_recall_and_norm(recall, norm):
    torch.manual_seed(0)
    model = build_model(ModelConfig(recall=recall, norm=norm, width=8, heads=2, attention_window=5))
    assert isinstance(model, LoopedModel) and is_looped(model) and has_recall_parts(model)
    inputs, targets = bits(2), torch.randint(0, 2, (2, L), generator=torch.Generator().manual_seed(1))
    a = stability.analyze(model, inputs, targets, AnalysisOptions(samples=2, **FAST))
    block = a["inputs"]
    assert a["format"] == "stability-analysis" and block["stages"] == list(DEFAULT_STAGES)
    assert_rho_matches_dense(a, model)
    p4 = block["prop4"]
    if recall == "none":
        assert p4["applicable"] is False and "recall none" in p4["reason"]
        assert block["recall"]["applicable"] is False
    else:
        assert p4["max_abs_diff_vs_autograd"] < 1e-12 and p4["columns_checked"] == L * 8
        assert np.allclose(p4["rho_M"], block["jacobian"]["spectral_radius"], atol=1e-6)
        assert abs(block["recall"]["rho_Wx"] - np.abs(np.linalg.eigvals(model.W_x.detach().double().numpy())).max()) < 1e-12
    whole, pos = hand_accuracy(model, inputs, targets, FAST["iterations"])
    assert np.allclose(block["accuracy"]["accuracy"], whole) and np.allclose(block["accuracy"]["position_accuracy"], pos)
    assert_verdict_consistent(block)
    assert set(block["timings"]) == set(DEFAULT_STAGES)


# ---- models that are not ours --------------------------------------------------------------------------------

def test_notebook_03s_mixer_loop_gets_the_whole_analysis():
    torch.manual_seed(0)
    model = MixerLoop()
    inputs = bits(4, seed=2)
    targets = torch.randint(0, 3, (4, L), generator=torch.Generator().manual_seed(3))
    a = stability.analyze(model, inputs, targets, AnalysisOptions(samples=4, tol=1e-10, **FAST))
    block = a["inputs"]
    assert block["fixed_point"]["converged_fraction"] == 1.0
    assert_rho_matches_dense(a, model)
    assert block["prop4"] == {"applicable": False, "reason": block["prop4"]["reason"]}
    assert "RecallParts" in block["prop4"]["reason"] and "g(x, x0)" in block["prop4"]["reason"]
    whole, pos = hand_accuracy(model, inputs, targets, FAST["iterations"])
    assert np.allclose(block["accuracy"]["accuracy"], whole) and np.allclose(block["accuracy"]["position_accuracy"], pos)
    with torch.no_grad():  # accuracy at x*: the readout of the returned fixed point, by hand
        right = analysis_model(model).readout(a.splits["inputs"].x_star).argmax(-1) == targets
    assert block["accuracy"]["at_fixed_point"] == pytest.approx(float(right.all(1).double().mean()))
    assert_verdict_consistent(block)
    v = block["verdict"]
    # all 4 converged, but 4 samples cannot show a share ≥ 90 %: its Wilson interval [0.60, 1] straddles it
    assert v["reachable"] == "partly" and v["intervals"]["converged_share"]["n"] == 4
    assert v["from_every_start"] == "yes" and v["input_dependent"] == "partly"  # n = 4: no bounded median interval
    assert "VERDICT" in a.summary().splitlines()[2] and "not applicable" in a.summary()


@pytest.mark.parametrize("recall,damping", [("internal", 1.0), ("external", 0.7), ("none", 1.0)])
def test_prop4_from_a_foreign_models_named_parts_equals_autograd(recall, damping):
    model = ToyRecall(recall=recall, damping=damping)
    assert isinstance(model, RecallParts) and has_recall_parts(model)
    m = analysis_model(model)
    inputs = torch.randn(2, L, 2, generator=torch.Generator().manual_seed(4))
    x0 = m.embed(inputs.double())
    x = x0 + 0.3 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for b in range(2):
        M = RecallMatrixOperator(m, x[b:b + 1], x0[b:b + 1]).linear_map().dense()[0]
        J = torch.func.jacrev(lambda t: m.step(t.unsqueeze(0), x0[b:b + 1])[0])(x[b]).reshape(L * 6, L * 6)
        assert (M - J).abs().max() < 1e-13
    a = stability.analyze(model, inputs, options=AnalysisOptions(samples=2, tol=1e-10, **FAST))
    block = a["inputs"]
    assert_rho_matches_dense(a, model)
    if recall == "none":
        assert block["prop4"]["applicable"] is False
    else:
        assert block["prop4"]["max_abs_diff_vs_autograd"] < 1e-13
        assert np.allclose(block["prop4"]["rho_M"], block["jacobian"]["spectral_radius"], atol=1e-6)
        assert block["prop4"]["form"].startswith({"internal": "M_int", "external": "M_ext"}[recall])
        assert ("damping" in block["prop4"]["form"]) == (damping != 1.0)
        assert block["recall"]["rho_Wx"] == pytest.approx(float(np.abs(np.linalg.eigvals(
            model.W_x.detach().double().numpy())).max()), abs=1e-12)
    assert block["accuracy"]["applicable"] is False  # no targets given
    assert_verdict_consistent(block)


def test_a_deq_in_plain_torch_with_a_flat_state():
    torch.manual_seed(6)
    model = DEQ()
    inputs = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))
    targets = torch.randint(0, 3, (5,), generator=torch.Generator().manual_seed(8))
    a = stability.analyze(model, inputs, targets, AnalysisOptions(samples=5, tol=1e-12, **{**FAST, "max_iter": 200}))
    block = a["inputs"]
    assert block["state_shape"] == [12]
    assert block["fixed_point"]["converged_fraction"] == 1.0
    assert_rho_matches_dense(a, model)
    # the map is a contraction (‖W‖₂ = 0.6, |tanh'| ≤ 1): ρ ≤ σ_max ≤ 0.6, one x* whatever e
    assert max(block["jacobian"]["sigma_max"]) <= 0.6 + 1e-9
    assert block["initial_iterate"]["fixed_point_distance_max"] < 1e-9
    # dx*/dx0 = (I − J)⁻¹ diag(1 − z*²): the Hutchinson estimate of its Frobenius norm is within its noise
    m = analysis_model(model)
    for b in range(2):
        z = a.splits["inputs"].x_star[b]
        D = torch.diag(1 - z.pow(2))
        exact = torch.linalg.solve(torch.eye(12, dtype=torch.float64) - D @ m.W.weight, D).norm()
        assert 0.3 < block["input_dependence"]["frobenius"][b] / float(exact) < 3.0
    whole, _ = hand_accuracy(model, inputs, targets, FAST["iterations"])
    assert np.allclose(block["accuracy"]["accuracy"], whole)
    assert_verdict_consistent(block)
    # 5 of 5 converged: the share's interval [0.65, 1] straddles 90 %, so PARTLY at this n
    assert block["verdict"]["reachable"] == "partly" and block["verdict"]["from_every_start"] == "yes"


def test_a_trm_style_two_part_carry_packed_into_one_state():
    torch.manual_seed(9)
    model = TRMStyle()
    inputs = bits(3, seed=10)
    targets = torch.randint(0, 2, (3, L), generator=torch.Generator().manual_seed(11))
    a = stability.analyze(model, inputs, targets, AnalysisOptions(samples=3, tol=1e-10, **{**FAST, "max_iter": 150}))
    block = a["inputs"]
    assert block["state_shape"] == [L, 8]  # (y, z) with d = 4 each
    assert_rho_matches_dense(a, model)
    # e = zeros is not shaped like x0, so A.8 starts from zeros and noise only
    assert block["initial_iterate"]["starts"] == ["zeros", "noise"]
    whole, pos = hand_accuracy(model, inputs, targets, FAST["iterations"])
    assert np.allclose(block["accuracy"]["accuracy"], whole) and np.allclose(block["accuracy"]["position_accuracy"], pos)
    assert_verdict_consistent(block)


def test_only_selected_stages_run_and_the_others_are_null():
    a = stability.analyze(MixerLoop(), bits(2), options=AnalysisOptions(samples=2, stages=("rho", "prop5"), **FAST))
    block = a["inputs"]
    assert block["stages"] == ["reachability", "rho", "prop5"]
    assert block["prop4"] is None and block["input_dependence"] is None and block["accuracy"] is None
    assert block["jacobian"]["spectral_radius"] and block["prop5"]["rel_error"]
    assert set(block["timings"]) == {"reachability", "rho", "prop5"}
    assert block["verdict"]["from_every_start"] is None and block["verdict"]["geometry"] == "not measured"
    with pytest.raises(StabilityError, match="allowed: reachability, rho, prop4"):
        AnalysisOptions(stages="rho,bogus")


# ---- the contract check --------------------------------------------------------------------------------------

class NoStep(nn.Module):
    def embed(self, inputs):
        return inputs

    def readout(self, x):
        return x


class BatchMixing(MixerLoop):
    def step(self, x, x0):  # mixes the samples: the mean over the batch axis
        return super().step(x, x0) + 0.1 * x.mean(0, keepdim=True)


def test_the_contract_check_names_what_is_wrong():
    with pytest.raises(StabilityError, match=r"missing step\(x, x0\)"):
        check_model(NoStep(), bits(2))
    with pytest.raises(StabilityError, match=r"missing initial_state\(x0, generator=None\)"):
        stability.analyze(type("Half", (MixerLoop,), {"initial_state": None})(), bits(2))
    with pytest.raises(StabilityError, match="not batch-independent"):
        check_model(BatchMixing().double(), bits(2).double())
    with pytest.raises(StabilityError, match=r"embed\(inputs\) failed on inputs of shape \(2, 6, 3\)"):
        check_model(MixerLoop(), bits(2, channels=3))
    with pytest.raises(StabilityError, match="do not match the readout"):
        check_model(MixerLoop(), bits(2), torch.zeros(2, L + 1, dtype=torch.long))
    with pytest.raises(StabilityError, match="fixed-depth"):
        check_model(build_model(ModelConfig(recall="fixed", norm="post", width=8, heads=2, depth=1)), bits(1))
    assert not is_looped(build_model(ModelConfig(recall="fixed", norm="post", width=8, heads=2, depth=1)))
    check_model(MixerLoop(), bits(1))  # one sample: batch independence is checked against a perturbed copy


# ---- the command line: --model ---------------------------------------------------------------------------------

MODULE = '''
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        torch.manual_seed(0)
        self.embed_in, self.A, self.B, self.out = nn.Linear(1, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 3)
        with torch.no_grad():
            self.A.weight.mul_(0.4 / torch.linalg.matrix_norm(self.A.weight, ord=2))

    def embed(self, inputs):
        return self.embed_in(inputs)

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return 0.5 * x + torch.tanh(self.A(x) + self.B(x0))

    def readout(self, x):
        return self.out(x)


class Mixing(Mixer):
    def step(self, x, x0):
        return super().step(x, x0) + x.mean(0, keepdim=True)


class NoStep(nn.Module):
    def embed(self, inputs):
        return inputs


def make():
    return Mixer()


def make_mixing():
    return Mixing()


def make_nostep():
    return NoStep()
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"user_models_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    inputs, targets = bits(3, seed=12), torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(13))
    torch.save(inputs, tmp_path / "inputs.pt")
    torch.save(targets, tmp_path / "targets.pt")
    yield name, tmp_path, inputs, targets
    sys.modules.pop(name, None)


CLI_FAST = ["--max-iter", "60", "--iterations", "4", "--probes", "2", "--eig-precision", "float64", "--quiet"]


def test_analyze_a_model_of_ones_own_from_the_command_line(user_module, capsys):
    from stability.cli import main

    name, tmp, inputs, targets = user_module
    model = __import__(name).make()
    torch.save(model.state_dict(), tmp / "w.pt")
    rc = main(["analyze", "--model", f"{name}:make", "--weights", "w.pt", "--inputs", "inputs.pt",
               "--targets", "targets.pt", "--json", "out.json", "--plots", "plots", *CLI_FAST])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith(f"model: {name}:make") and "VERDICT" in out and "split: inputs" in out
    report = json.loads((tmp / "out.json").read_text())
    assert report["format"] == "stability-analysis" and report["schema_version"] >= 2
    assert report["source"]["model"] == f"{name}:make" and report["splits"] == ["inputs"]
    block = report["inputs"]
    assert block["samples"] == 3
    # the same numbers as the Python API on the same model
    ref = stability.analyze(model, inputs, targets, AnalysisOptions(samples=32, max_iter=60, iterations=4, probes=2,
                                                                    eig_precision="float64"))
    assert np.allclose(block["jacobian"]["spectral_radius"], ref["inputs"]["jacobian"]["spectral_radius"], atol=1e-12)
    assert_rho_matches_dense(ref, model)
    whole, pos = hand_accuracy(model, inputs, targets, 4)
    assert np.allclose(block["accuracy"]["accuracy"], whole) and np.allclose(block["accuracy"]["position_accuracy"], pos)
    assert report["verdict"]["inputs"] == block["verdict"]
    assert {p.name for p in (tmp / "plots").iterdir()} == {"residuals.png", "eigenvalues.png", "accuracy.png",
                                                           "prop5.png", "geometry_region.png"}


def test_only_on_the_command_line(user_module, capsys):
    from stability.cli import main

    name, tmp, _, _ = user_module
    assert main(["analyze", "--model", f"{name}:make", "--inputs", "inputs.pt", "--only", "rho,prop5",
                 "--json", "o.json", *CLI_FAST]) == 0
    block = json.loads((tmp / "o.json").read_text())["inputs"]
    assert block["stages"] == ["reachability", "rho", "prop5"] and block["input_dependence"] is None
    capsys.readouterr()
    assert main(["analyze", "--model", f"{name}:make", "--inputs", "inputs.pt", "--only", "rho,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown stage 'nope'" in err[0] and ", ".join(STAGES) in err[0]


def test_bad_models_and_inputs_fail_with_one_line_and_write_nothing(user_module, capsys):
    from stability.cli import main

    name, tmp, _, _ = user_module
    (tmp / "corrupt.pt").write_bytes(b"\x80\x02not a torch file")
    torch.save(torch.zeros(2, L, 3), tmp / "wide.pt")
    cases = [
        (["--model", "no_such_module_xyz:make", "--inputs", "inputs.pt"], "no module named 'no_such_module_xyz'"),
        (["--model", f"{name}:nothing", "--inputs", "inputs.pt"], "has no attribute 'nothing'"),
        (["--model", f"{name}", "--inputs", "inputs.pt"], "PACKAGE.MODULE:FACTORY"),
        (["--model", f"{name}:make_nostep", "--inputs", "inputs.pt"], "missing step(x, x0)"),
        (["--model", f"{name}:make_mixing", "--inputs", "inputs.pt"], "not batch-independent"),
        (["--model", f"{name}:make", "--inputs", "wide.pt"], "failed on inputs of shape (2, 6, 3)"),
        (["--model", f"{name}:make", "--inputs", "missing.pt"], "no such file"),
        (["--model", f"{name}:make", "--inputs", "corrupt.pt"], "corrupt"),
        (["--model", f"{name}:make", "--inputs", "inputs.pt", "--weights", "inputs.pt"], "not a state dict"),
        (["--model", f"{name}:make"], "needs --inputs"),
    ]
    for args, fragment in cases:
        rc = main(["analyze", *args, "--json", "bad.json", "--plots", "badplots", "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2, args
        assert len(err) == 1 and err[0].startswith("stability analyze: error:") and fragment in err[0], (args, err)
        assert not (tmp / "bad.json").exists() and not (tmp / "badplots").exists()
