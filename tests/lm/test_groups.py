"""The geometry stage's parameter groups of a language model: by module type (attention, MLP / experts, router,
norms, embeddings, injection), checked against the parameter names listed by hand, and the user's own groups."""

import pytest
import torch

from stability.analysis.perturbation import loop_parameters, parameter_groups
from stability.errors import StabilityError
from stability.lm import InklingLoopAdapter, analyze_lm, pack
from stability.lm.analyze import set_user_groups
from stability.lm.huginn import tiny
from tests.lm.conftest import float64, ids, inkling_model


def groups_of(m):
    inputs = pack(ids(1))
    x0 = m.embed(inputs)
    x = m.initial_state(x0)
    names, outside, _ = loop_parameters(m, inputs, x, x0)
    return names, outside, parameter_groups(m, names, inputs, x, x0)


def test_huginn_loop_parameters_group_by_module_type():
    m = float64(tiny())
    names, outside, groups = groups_of(m)
    # by hand: the prelude and core blocks' attention, MLP and norms, the token embedding, the concat adapter
    loop = [f"{part}.{i}" for part, n in (("prelude", 1), ("core", 2)) for i in range(n)]
    expect = {"embeddings": ["embedding.weight"],
              "norms": [f"{b}.norms.{j}.weight" for b in loop for j in range(4)],
              "attention": [f"{b}.attn.{w}.weight" for b in loop for w in ("qkv", "out")],
              "MLP / experts": [f"{b}.{w}.weight" for b in loop for w in ("gate_up", "down")],
              "injection": ["adapter.weight"]}
    assert {k: sorted(v) for k, v in groups.items()} == {k: sorted(v) for k, v in expect.items()}
    assert sorted(outside) == sorted(k for k, _ in m.named_parameters() if k.startswith(("coda.", "norm.",
                                                                                           "lm_head.")))


def test_inkling_routers_and_messages_are_groups_of_their_own():
    pytest.importorskip("transformers")
    m = float64(InklingLoopAdapter(inkling_model()))
    names, _, groups = groups_of(m)
    # by hand: every layer's mixture-of-experts gate (the prelude's reaches x0, the loop's the step); the message
    # input and the message gates; the experts; the self-attention (and its block-attention query)
    assert groups["router"] == [k for k in names if ".mlp.gate." in k] and len(groups["router"]) == 3
    assert groups["messages"] == [k for k in names if "message" in k]
    assert [k for k in names if ".experts." in k] == [k for k in groups["MLP / experts"] if ".experts." in k]
    assert all(".self_attn." in k or "attention" in k for k in groups["attention"])
    assert groups["embeddings"] == ["hf.model.embed_tokens.weight"]
    assert list(groups) == ["router", "embeddings", "norms", "attention", "MLP / experts", "messages"]


def test_user_groups_replace_the_types_and_bad_prefixes_are_refused():
    m = float64(tiny())
    set_user_groups(m, {"core": ["core"], "attention of block 0": ["prelude.0.attn"]})
    _, _, groups = groups_of(m)
    core = [k for k, _ in m.named_parameters() if k.startswith("core.")]
    assert groups["core"] == core and groups["attention of block 0"] == ["prelude.0.attn.qkv.weight",
                                                                         "prelude.0.attn.out.weight"]
    assert set(groups["other"]) == {"embedding.weight", "adapter.weight"} | {
        k for k, _ in m.named_parameters() if k.startswith("prelude.0.") and ".attn." not in k}
    with pytest.raises(StabilityError, match="no parameter of Huginn starts with 'cor.'"):
        analyze_lm(float64(tiny()), ids(1), parameter_groups={"x": ["cor."]})


def test_the_geometry_stage_reports_a_language_models_groups():
    from stability.config import AnalysisOptions

    m = float64(tiny())
    with torch.no_grad():
        m.adapter.weight[:, :m.cfg.hidden] *= 0.3  # a contracting loop: x* quickly
    opts = AnalysisOptions(samples=1, stages=("reachability", "rho", "geometry"), geometry_directions=1,
                           geometry_samples=1, geometry_accuracy=0.5, geometry_certify=0)
    a = analyze_lm(m, ids(1), options=opts, lm_stages=())
    geo = a["inputs"]["geometry"]
    by_label = {g["name"]: g["parameters"] for g in geo["groups"]}
    assert list(by_label) == ["embeddings", "norms", "attention", "MLP / experts", "injection"]
    assert by_label["injection"] == ["adapter.weight"] and by_label["embeddings"] == ["embedding.weight"]
