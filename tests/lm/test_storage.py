"""The reduced-copy path of a language model's analysis (stability.lm.storage, fixed_point.step_copy): the float64
analysis copy with its embedding and LM head stored in float32, and stage rho's / prop4's float32 copy of what
``step`` reaches only, give the numbers of the old whole-copy path (a whole float64 copy; a whole float32 copy for
the mixed products) to rounding, on tiny random ``transformers`` models and the reference Huginn built here."""

import pytest
import torch

from stability.analysis.fixed_point import cast_copy, step_copy
from stability.analysis.recall import prop4_matrix_free
from stability.config import AnalysisOptions
from stability.lm import analyze_lm
from stability.lm.analyze import as_adapter
from stability.lm.huginn import tiny
from stability.lm.pretrained import adapt, load_hf_model, load_pretrained
from stability.lm.storage import Float32Embedding, Float32Head, analysis_copy, stored_float32
from stability.numerics import Linearisation, spectral_radius
from tests.lm.conftest import float64, hrm_model, ids, inkling_model, padded_mask
from tests.numerics.test_dense_route import point, small_model

RHO = AnalysisOptions(samples=3, stages=("reachability", "rho", "prop5"), max_iter=60, eig_precision="mixed",
                      eig_tol=1e-9)


def test_mixed_storage_keeps_the_vocabulary_tables_in_float32_with_the_float64_logits():
    m = tiny(0)  # untied: embedding 64 × 32 and head 64 × 32 in float32
    x = ids(3, vocab=64)
    mixed, whole = analysis_copy(m), float64(m)
    assert isinstance(mixed.embedding, Float32Embedding) and isinstance(mixed.lm_head, Float32Head)
    assert mixed.embedding.weight.dtype == torch.float32 and mixed.core[0].down.weight.dtype == torch.float64
    assert stored_float32(mixed) == 2 * 64 * 32
    assert m.embedding.weight.dtype == torch.float32 and type(m.embedding) is torch.nn.Embedding  # source untouched
    with torch.no_grad():
        x0m, x0w = mixed.embed(x), whole.embed(x)
        assert x0m.dtype == torch.float64 and torch.equal(x0m, x0w)  # a lookup copies: exact
        got, ref = mixed.unroll(x), whole.unroll(x)
    assert got.dtype == torch.float64 and (got - ref).abs().max() <= 1e-12 * ref.abs().max()


def test_a_directory_loads_as_the_mixed_analysis_copy_with_the_float64_logits(hrm_dir):
    loaded = load_pretrained(hrm_dir, dtype=torch.float64)
    emb, head = loaded.model.body.embed_tokens, loaded.model.hf.lm_head
    assert isinstance(emb, Float32Embedding) and isinstance(head, Float32Head)
    assert emb.weight.dtype == torch.float32 and stored_float32(loaded.model) == 2 * 48 * 32
    ref = adapt(load_hf_model(hrm_dir, dtype=torch.float64))  # the old path: all of it loaded in float64
    x = ids(2)
    with torch.no_grad():
        got, want = loaded.model.unroll(x), ref.unroll(x)
    assert got.dtype == torch.float64 and (got - want).abs().max() <= 1e-12 * want.abs().max()


def test_a_tied_table_is_kept_once_in_float32():
    m = analysis_copy(adapt(hrm_model(tie_word_embeddings=True)))
    emb, head = m.body.embed_tokens, m.hf.lm_head
    assert head.weight is emb.weight and emb.weight.dtype == torch.float32 and isinstance(head, Float32Head)


def test_a_subclassed_embedding_stays_float64():
    m = analysis_copy(adapt(inkling_model(structured=False)))  # Inkling's embedding normalises its rows
    emb, head = m.hf.model.embed_tokens, m.hf.lm_head
    assert not isinstance(emb, Float32Embedding) and emb.weight.dtype == torch.float64
    assert head.weight is not emb.weight and isinstance(head, Float32Head)  # its untied head: a plain Linear
    x = ids(2)
    with torch.no_grad():
        got, ref = m.unroll(x), float64(adapt(inkling_model(structured=False))).unroll(x)
    assert (got - ref).abs().max() <= 1e-12 * ref.abs().max()


@pytest.mark.parametrize("make", [lambda: tiny(0), lambda: adapt(hrm_model())], ids=["huginn", "hrm"])
def test_reduced_copy_path_gives_the_whole_copy_paths_rho_token_rho_prop5_and_scoring(make):
    m = make()
    x, mask = ids(3, vocab=48), padded_mask(3)
    new = analyze_lm(m, x, mask, options=RHO).to_json()  # the float32 model: copied to the mixed analysis copy
    old = analyze_lm(float64(m), x, mask, options=RHO).to_json()  # a whole float64 copy, used as it is
    a, b = new["inputs"], old["inputs"]
    assert a["fixed_point"]["status"] == b["fixed_point"]["status"]
    assert a["jacobian"]["spectral_radius"] == pytest.approx(b["jacobian"]["spectral_radius"], abs=1e-9)
    assert new["lm"]["token_rho"]["rho"] == pytest.approx(old["lm"]["token_rho"]["rho"], abs=1e-12)
    assert a["prop5"]["rel_error"] == pytest.approx(b["prop5"]["rel_error"], rel=1e-6, abs=1e-12)
    sa, sb = new["lm"]["scoring"]["at_fixed_point"], old["lm"]["scoring"]["at_fixed_point"]
    assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-12) and sa["token_accuracy"] == sb["token_accuracy"]


def test_step_copy_leaves_out_what_step_does_not_reach_and_gives_the_whole_float32_copys_rho():
    m = as_adapter(tiny(0))[0]
    x = ids(2, vocab=64)
    with torch.no_grad():
        x0 = m.embed(x)
        xs = _iterate(m, x0)
    fast, whole = step_copy(m, torch.float32, xs, x0), cast_copy(m, torch.float32)
    meta = {k for k, p in fast.named_parameters() if p.is_meta}
    assert {"embedding.weight", "lm_head.weight", "norm.weight"} <= meta and not any("core." in k for k in meta)
    assert all(p.dtype == torch.float32 for p in fast.parameters())
    got, ref = (spectral_radius(Linearisation(m.step, xs, x0), route="krylov", tol=1e-10, k=3,
                                fast=Linearisation(f.step, xs.float(), x0.float())) for f in (fast, whole))
    assert got.rho.tolist() == pytest.approx(ref.rho.tolist(), abs=1e-12)
    dense = torch.linalg.eigvals(Linearisation(m.step, xs, x0).dense()).abs().max(-1).values  # the reference
    assert got.rho.tolist() == pytest.approx(dense.tolist(), abs=1e-8)


def test_step_copy_gives_the_whole_float32_copys_prop4_on_a_recall_model():
    m = small_model()  # the project's model with named recall parts (Prop. 4)
    xs, x0 = point(m)
    fast = step_copy(m, torch.float32, xs, x0)
    assert any(p.is_meta for p in fast.parameters())  # its input embedding: not reached by step
    got = prop4_matrix_free(m, xs, x0, probes=2, k=3, tol=1e-10, fast_model=fast)
    ref = prop4_matrix_free(m, xs, x0, probes=2, k=3, tol=1e-10, fast_model=cast_copy(m, torch.float32))
    assert got.rho_M == pytest.approx(ref.rho_M, abs=1e-12)
    J = Linearisation(m.step, xs, x0).dense()  # M = J (Prop. 4): the dense J's ρ is the reference
    assert got.rho_M == pytest.approx(torch.linalg.eigvals(J).abs().max(-1).values.tolist(), abs=1e-8)


def test_geometry_of_the_mixed_copy_equals_the_whole_float64_copys():
    m = tiny(0, vocab_size=48)
    opts = AnalysisOptions(samples=2, stages=("reachability", "rho", "geometry"), max_iter=80, eig_tol=1e-8,
                           geometry_directions=2, geometry_group_directions=0, geometry_plane=0)
    x = ids(2)
    new = analyze_lm(m, x, options=opts, lm_stages=()).to_json()["inputs"]["geometry"]
    old = analyze_lm(float64(m), x, options=opts, lm_stages=()).to_json()["inputs"]["geometry"]
    assert new["samples"] == old["samples"] and new["outside_loop"] == old["outside_loop"]
    flat = [r for rs in new["radii"] for r in rs]
    assert len(flat) == 4 and flat == pytest.approx([r for rs in old["radii"] for r in rs], rel=1e-9)
    assert new["reasons"] == old["reasons"]


def _iterate(m, x0, steps=200):
    x = m.initial_state(x0, generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        x = m.step(x, x0)
    return x


def test_geometry_in_place_gives_the_stacked_radii_and_leaves_the_model_as_it_was(monkeypatch):
    """A language model whose loop parameter set is above IN_PLACE_BYTES (here set below this tiny one's) has its
    geometry directions applied in place: the radii of the stacked search (to the bracket's accuracy; each row's
    search is its own), its float32 vocabulary table perturbed in place and put back, every parameter of the
    analysis copy bit for bit as before."""
    import stability.analysis.geometry as geometry

    m = analysis_copy(tiny(0, vocab_size=48))
    opts = AnalysisOptions(samples=2, stages=("reachability", "rho", "geometry"), max_iter=80, eig_tol=1e-8,
                           geometry_samples=1, geometry_directions=1, geometry_group_directions=1,
                           geometry_plane=0, geometry_accuracy=0.3, geometry_certify=1)
    x = ids(2)
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    groups = {"embeddings": ["embedding"]}  # the float32 table: perturbed in place and put back
    stacked = analyze_lm(m, x, options=opts, lm_stages=(), parameter_groups=groups).to_json()["inputs"]["geometry"]
    monkeypatch.setattr(geometry, "IN_PLACE_BYTES", 1024)
    said = []
    here = analyze_lm(m, x, options=opts, lm_stages=(), log=said.append,
                      parameter_groups=groups).to_json()["inputs"]["geometry"]
    assert here["evaluation"].startswith("in place") and not stacked["evaluation"].startswith("in place")
    assert any("applied in place" in s for s in said)
    assert m.embedding.weight.dtype == torch.float32 and "embedding.weight" in [
        p for g in here["groups"] for p in g["parameters"]]
    assert all(torch.equal(v, before[k]) for k, v in m.named_parameters())
    assert here["samples"] == stacked["samples"] and here["reasons"] == stacked["reasons"]
    flat = lambda g: [r for rs in g["radii"] for r in rs] + [r for grp in g["groups"] for r in grp["radii"]]  # noqa
    assert len(flat(here)) == len(flat(stacked)) == 6 and min(flat(here)) > 0  # all, embeddings, the rest
    assert flat(here) == pytest.approx(flat(stacked), rel=opts.geometry_accuracy)
