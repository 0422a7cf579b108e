"""The adapters of Inkling-2 Loop and HRM-Text present the model contract and reproduce their model: the unrolled
loop at the model's own depth gives ``model(input_ids).logits`` bitwise (the same kernels) or to float rounding (the
model's default kernels), padded batches included; ``stability.load(HF_DIR)`` of a save_pretrained directory gives
the adapter; the float64 copy is float64 throughout and passes ``check_model`` (jvp, vjp, double backward)."""

import copy
import json

import pytest
import torch

pytest.importorskip("transformers")

import stability  # noqa: E402
from stability.errors import CheckpointError, StabilityError  # noqa: E402
from stability.lm import HrmTextAdapter, InklingLoopAdapter, adapt, pack, precision_audit  # noqa: E402
from stability.lm.pretrained import PretrainedLoaded, load_hf_model  # noqa: E402
from stability.protocols import check_model  # noqa: E402
from tests.lm.conftest import float64, hrm_model, ids, inkling_model, padded_mask  # noqa: E402


@pytest.mark.parametrize("loop_end,K", [(2, 1), (3, 2)])
def test_inkling_unrolled_equals_the_models_logits(loop_end, K):
    kw = {} if loop_end == 3 else {"num_hidden_layers": 3, "loop_layer_index_end": 2,
                                   "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"]}
    model = inkling_model(**kw)
    default = copy.deepcopy(model)  # grouped_mm experts, as loaded
    a = InklingLoopAdapter(model)  # batched_mm experts
    assert (a.K, a.model_steps, a.carry_channels) == (K, 2, K * 32)
    x = ids()
    with torch.no_grad():
        got = a.unroll(x)
        assert torch.equal(got, model(x, use_cache=False).logits)  # the same kernels: bitwise
        assert torch.allclose(got, default(x).logits, atol=1e-5, rtol=0)  # the default experts, a cache: rounding


def test_hrm_unrolled_equals_the_models_logits():
    model = hrm_model()
    sdpa = copy.deepcopy(model)
    a = HrmTextAdapter(model)  # eager attention
    assert (a.model_steps, a.carry_channels) == (2, 64)
    x = ids()
    with torch.no_grad():
        got = a.unroll(x)
        assert torch.equal(got, model(x, use_cache=False).logits)
        assert torch.allclose(got, sdpa(x).logits, atol=1e-5, rtol=0)  # SDPA and a KV cache: rounding


@pytest.mark.parametrize("make,cls", [(inkling_model, InklingLoopAdapter), (hrm_model, HrmTextAdapter)])
def test_a_padded_batch_gives_the_models_padded_logits_at_real_tokens(make, cls):
    model = make()
    a = cls(copy.deepcopy(model))
    x, m = ids(), padded_mask()
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = a.hf(x, attention_mask=m, position_ids=pos, use_cache=False).logits
        got = a.unroll(pack(x, m))
    real = m.bool()
    assert torch.equal(got[real], ref[real])


@pytest.mark.parametrize("make,cls", [(inkling_model, InklingLoopAdapter), (hrm_model, HrmTextAdapter)])
def test_the_float64_copy_is_float64_throughout_and_satisfies_the_contract(make, cls):
    a64 = float64(cls(make()))
    inputs = pack(ids(2), padded_mask(2))
    assert precision_audit(a64, inputs) == {}
    check_model(a64, inputs)  # shapes, purity, batch independence, jvp / vjp / double backward
    with torch.no_grad():
        x0 = a64.embed(inputs)
        x = a64.step(a64.initial_state(x0), x0)
    assert x0.dtype == x.dtype == torch.float64
    assert bool((x[0, :3, :a64.dynamic_channels] == 0).all())  # pad tokens stay 0
    lo = cls(make()).unroll(inputs)
    assert torch.allclose(a64.unroll(inputs).float(), lo, atol=1e-5, rtol=0)


def test_hrm_step_does_not_read_the_input():
    """HRM-Text's loop map has no input injection: ∂f/∂x0 = 0 (the input enters through e only)."""
    a64 = float64(HrmTextAdapter(hrm_model()))
    x0 = a64.embed(ids(1))
    x = a64.initial_state(x0)
    _, k = torch.func.jvp(lambda u: a64.step(x, u), (x0,), (torch.randn_like(x0),))
    assert float(k.abs().max()) == 0.0


@pytest.mark.parametrize("fixture,cls,kind", [("inkling_dir", InklingLoopAdapter, "inkling2_loop_text"),
                                              ("hrm_dir", HrmTextAdapter, "hrm_text")])
def test_stability_load_of_a_save_pretrained_directory_gives_the_adapter(request, fixture, cls, kind):
    path = request.getfixturevalue(fixture)
    loaded = stability.load(path)
    assert isinstance(loaded, PretrainedLoaded) and isinstance(loaded.model, cls)
    assert loaded.model_type == kind and loaded.task is None
    assert not any(p.requires_grad for p in loaded.model.parameters())
    x = ids(2)
    with torch.no_grad():
        ref = adapt(load_hf_model(path)).hf(x, use_cache=False).logits
    assert torch.equal(loaded.model.unroll(x), ref)
    f64 = load_hf_model(path, dtype=torch.float64)
    assert {p.dtype for p in f64.parameters()} | {b.dtype for b in f64.buffers() if b.is_floating_point()} \
        == {torch.float64}  # the modules a model keeps in float32 are float64 too


def test_a_remote_code_directory_is_refused_without_trust(tmp_path, hrm_dir):
    for f in hrm_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="remote-code architecture"):
        stability.load(tmp_path)


def test_an_unknown_architecture_names_the_known_ones():
    class Model(torch.nn.Module):
        class config:
            model_type = "llama"

    with pytest.raises(StabilityError, match="no adapter for model_type 'llama'.*hrm_text"):
        adapt(Model())


def test_hrm_prefix_lm_block_gives_the_models_logits_with_token_type_ids():
    """A PrefixLM batch (token_type_ids 1 on a bidirectional prefix, padding too): the adapter's logits are the
    model's own ``model(ids, attention_mask, token_type_ids)`` at every real token, and differ from the causal ones
    inside the block (the block is really read)."""
    model = hrm_model()
    assert model.config.prefix_lm
    a = HrmTextAdapter(copy.deepcopy(model))
    x, m = ids(), padded_mask()
    tt = torch.zeros_like(x)
    tt[:, :5] = 1  # sample 0's block starts after its 3 pads; sample 1's ends before its pads
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = a.hf(x, attention_mask=m, position_ids=pos, token_type_ids=tt, use_cache=False).logits
        got = a.unroll(pack(x, m, token_type_ids=tt))
        causal = a.unroll(pack(x, m))
    real = m.bool()
    assert torch.allclose(got[real], ref[real], atol=1e-6, rtol=0)
    assert (got[real] - causal[real]).abs().max() > 1e-3


def test_the_block_makes_the_map_non_causal_and_is_refused_by_a_model_without_one():
    """x0 carries the block: ``causal_at`` is False for a PrefixLM batch, True without one; Inkling (no
    bidirectional block) refuses token_type_ids in one line."""
    a = float64(HrmTextAdapter(hrm_model()))
    x, tt = ids(2), torch.zeros(2, 8, dtype=torch.long)
    tt[:, :3] = 1
    assert a.causal_at(a.embed(pack(x)))
    assert not a.causal_at(a.embed(pack(x, token_type_ids=tt)))
    with pytest.raises(StabilityError, match="no bidirectional block"):
        InklingLoopAdapter(inkling_model()).embed(pack(x, token_type_ids=tt))
