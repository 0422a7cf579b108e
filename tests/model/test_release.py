"""The paper's release checkpoints imported into the LoopedTransformer: the same function, to float64 rounding.

Two kinds of reference:

* the outputs the release's own code recorded for the two fixture checkpoints (tests/fixtures/release/, written by
  the release's ``train_model.py``: external × post on prefix sums, internal × gru on sudoku), every iteration
  1..50, in float32 and float64; only these two recall × norm cells can be checked against recorded outputs;
* for every other recall × norm cell of the release grid, a forward pass of the release's model written out here
  from its description (``release_forward``: nn.RMSNorm's ε, nn.GRUCell, complex RoPE, an explicit neighbourhood
  mask), run on release-format weights. It is itself checked against the recorded outputs first.
"""

from __future__ import annotations

import os
import copy
import itertools
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.func import jacfwd, jacrev, jvp, vjp, vmap

import stability
from stability import release
from stability.cli import main
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig, to_dict
from stability.model import build_model
from stability.model.attention import shifted_neighbours
from stability import checkpoint as ckpt
from tests.conftest import FIXTURES

RELEASE = FIXTURES / "release"
RUNS = ["external_prefix_sums_post_lr0.0001_seed0", "internal_sudoku_gru_lr0.0001_seed0"]
EPS32 = torch.finfo(torch.float32).eps


def reference(run: str) -> dict:
    return torch.load(RELEASE / run / "reference_outputs.pt", weights_only=True)


def release_run_dir(tmp_path: Path, run: str) -> Path:
    dst = tmp_path / run
    shutil.copytree(RELEASE / run, dst)
    return dst


# ---- the release's forward, written out from its description ---------------------------------------------------
def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, eps=None)  # nn.RMSNorm(d): ε = finfo(x.dtype).eps


def _rope(x, spatial):
    """x (B, H, *spatial, D): interleaved pairs rotated by complex numbers whose angles are float32."""
    D, n = x.shape[-1], len(spatial)
    k = D // (2 * n)
    theta = 1.0 / (10000.0 ** (torch.arange(k, dtype=torch.float32) / k))
    grids = torch.meshgrid(*[torch.arange(s, dtype=torch.float32) for s in spatial], indexing="ij")
    angles = torch.cat([g[..., None] * theta for g in grids], dim=-1)  # (*spatial, D/2)
    rot = torch.complex(angles.cos(), angles.sin())  # float32 cos/sin, then cast to the activations' precision
    rot = rot.to(torch.complex128 if x.dtype == torch.float64 else torch.complex64)
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


def _neighbourhood_mask(spatial, kernel):
    """Brute force: query p sees key q iff on every axis q_a ∈ [s_a, s_a + w), w = min(kernel, n),
    s_a = clamp(p_a − kernel//2, 0, n − w)."""
    coords = list(itertools.product(*[range(s) for s in spatial]))
    mask = torch.zeros(len(coords), len(coords), dtype=torch.bool)
    for i, p in enumerate(coords):
        for j, q in enumerate(coords):
            ok = True
            for a, n in enumerate(spatial):
                w = min(kernel, n)
                s = min(max(p[a] - kernel // 2, 0), n - w)
                ok &= s <= q[a] < s + w
            mask[i, j] = ok
    return mask


def _attention(P, x, table):
    B, spatial, d = x.shape[0], x.shape[1:-1], x.shape[-1]
    H, L = 8, math.prod(spatial)
    q, k, v = F.linear(x, P["attn.qkv.weight"], P["attn.qkv.bias"]).chunk(3, dim=-1)
    perm = (0, len(spatial) + 1, *range(1, len(spatial) + 1), len(spatial) + 2)
    q, k, v = (t.reshape(B, *spatial, H, d // H).permute(*perm) for t in (q, k, v))
    q, k = _rope(q, spatial), _rope(k, spatial)
    if "attn.q_norm.weight" in P:
        q, k = _rms(q, P["attn.q_norm.weight"]), _rms(k, P["attn.k_norm.weight"])
    q, k, v = (t.reshape(B, H, L, d // H) for t in (q, k, v))
    mask = _neighbourhood_mask(spatial, table["kernel_size"]) if table["attn_type"] == "local" else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.linear(out.transpose(1, 2).reshape(B, *spatial, d), P["attn.out_proj.weight"], P["attn.out_proj.bias"])


def _block(P, table, x, x0):
    norm = lambda name, u: _rms(u, P[name + ".weight"]) if name + ".weight" in P else u  # noqa: E731
    recall = table["injection_type"] == "linear"
    g = lambda u: F.linear(u, P["Wx.weight"], P["Wx.bias"]) + F.linear(x0, P["Wh.weight"], P["Wh.bias"])  # noqa
    if table["residual_method"] == "gru":
        cell = torch.nn.GRUCell(x.shape[-1], x.shape[-1]).to(x.dtype)
        cell.load_state_dict({n: P["gru." + n] for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
        R = lambda u, v: cell(v.reshape(-1, v.shape[-1]), u.reshape(-1, u.shape[-1])).reshape(u.shape)  # noqa
    else:
        R = lambda u, v: u + v  # noqa: E731
    mlp = lambda u: F.linear(F.gelu(F.linear(u, P["mlp.0.weight"], P["mlp.0.bias"])),  # noqa: E731
                             P["mlp.2.weight"], P["mlp.2.bias"])
    inner = recall and table["recall_inner"]
    u = g(x) if recall and not inner else x
    for F_s in (lambda v: _attention(P, v, table), mlp):
        a = norm("pre_norm_func", u)
        u = norm("post_norm_func", R(u, norm("peri_norm_func", F_s(g(a) if inner else a))))
    return u


def release_forward(net: dict, table: dict, inputs: torch.Tensor, iterations: int) -> torch.Tensor:
    """The release's eval forward: (B, C, *spatial) inputs -> (B, T, C_out, *spatial) logits (the fixed baseline:
    its stack of blocks once, at iteration 1)."""
    net = {k.replace("._orig_mod.", "."): v for k, v in net.items()}
    blocks = sorted({int(k.split(".")[1]) for k in net if k.startswith("recur_blocks.")})
    params = [{k[len(f"recur_blocks.{i}."):]: v for k, v in net.items() if k.startswith(f"recur_blocks.{i}.")}
              for i in blocks]
    x = inputs.movedim(1, -1)
    x0 = F.linear(x, net["projection.weight"], net["projection.bias"])

    def head(u):
        h = F.gelu(F.linear(_rms(u, net["head.0.weight"]), net["head.1.weight"], net["head.1.bias"]))
        return F.linear(h, net["head.3.weight"], net["head.3.bias"]).movedim(-1, 1)

    outs, u = [], x0
    for _ in range(iterations):
        for P in params:
            u = _block(P, table, u, x0)
        outs.append(head(u))
    return torch.stack(outs, dim=1)


def test_the_written_out_release_forward_reproduces_the_recorded_outputs():
    for run in RUNS:
        ref = reference(run)
        net = torch.load(RELEASE / run / "model_best.pth", weights_only=True)["net"]
        net64 = {k: v.double() for k, v in net.items()}
        out = release_forward(net64, ref["release_model_config"], ref["inputs_release_layout"].double(), 50)
        assert (out - ref["logits_float64"]).abs().max() <= 4e-15


# ---- the two fixtures against the release's recorded outputs --------------------------------------------------
@pytest.mark.parametrize("run", RUNS)
def test_imported_release_checkpoint_gives_the_recorded_logits_at_every_iteration(run, tmp_path):
    ref = reference(run)
    loaded = stability.load(RELEASE / run / "model_best.pth")
    assert loaded.package_version == "release"
    model = loaded.model
    with torch.no_grad():
        m64 = copy.deepcopy(model).double()
        inputs = ref["inputs_stability_layout"].double()
        assert torch.equal(release.to_stability_layout(ref["inputs_release_layout"].double()), inputs)
        logits = release.to_release_layout(m64(inputs, 50))
        assert logits.shape == ref["logits_float64"].shape
        # measured: 4.7e-16 (prefix sums), 9.0e-16 (sudoku); logits of size ~0.4-0.7
        assert (logits - ref["logits_float64"]).abs().max() <= 4e-15
        x0 = m64.embed(inputs)
        assert (x0 - ref["x0_float64"]).abs().max() <= 1e-15
        x = m64.initial_state(x0)
        for t in range(1, 51):
            x = m64.step(x, x0)
            if str(t) in ref["states_float64"]:
                assert (x - ref["states_float64"][str(t)]).abs().max() <= 1e-14 * max(1.0, x.abs().max().item())
        m32 = copy.deepcopy(model).float()
        out32 = release.to_release_layout(m32(ref["inputs_stability_layout"], 50))
        # float32 against the release's float32 run (natten / SDPA kernels): measured 2.7e-7 and 5.1e-7
        scale = ref["logits_float32"].abs().max().item()
        assert (out32 - ref["logits_float32"]).abs().max() <= 16 * EPS32 * max(1.0, scale)


@pytest.mark.parametrize("change,run,at_least", [
    ({"window_edges": "cut"}, RUNS[0], 1e-3),       # measured 2.3e-2
    ({"norm_eps": 1e-6}, RUNS[0], 1e-8),            # measured 4.9e-7
    ({"norm_eps": 1e-6}, RUNS[1], 1e-6),            # measured 4.2e-5
    ({"rope_precision": "float64"}, RUNS[0], 1e-10),  # measured 3.5e-9
    ({"rope_precision": "float64"}, RUNS[1], 1e-10),  # measured 1.6e-9
])
def test_each_legacy_semantic_alone_breaks_the_match(change, run, at_least):
    ref = reference(run)
    loaded = stability.load(RELEASE / run / "model_best.pth")
    legacy = build_model(loaded.config.model.replace(**change)).double().eval()
    legacy.load_state_dict(loaded.model.state_dict())
    with torch.no_grad():
        logits = release.to_release_layout(legacy(ref["inputs_stability_layout"].double(), 50))
    assert (logits - ref["logits_float64"]).abs().max() > at_least


def test_cut_windows_move_prefix_sum_states_far_from_the_release():
    run = RUNS[0]
    ref = reference(run)
    loaded = stability.load(RELEASE / run / "model_best.pth")
    cut = build_model(loaded.config.model.replace(window_edges="cut")).double().eval()
    cut.load_state_dict(loaded.model.state_dict())
    with torch.no_grad():
        x0 = cut.embed(ref["inputs_stability_layout"].double())
        x = x0
        for _ in range(10):
            x = cut.step(x, x0)
    diff = (x - ref["states_float64"]["10"]).abs()
    # the two end tokens see 3 keys instead of 5, and the difference travels inward ~2 tokens per iteration
    assert diff.max() > 0.1
    assert diff[:, 24].max() < 1e-12  # the middle token is still outside the reach of the ends after 10 steps


def test_import_writes_a_toolkit_checkpoint_that_loads_to_the_same_function(tmp_path, capsys):
    for run in RUNS:
        out = tmp_path / f"{run}.pt"
        assert main(["import", str(RELEASE / run / "model_best.pth"), "--out", str(out)]) == 0
        assert str(out) in capsys.readouterr().out
        assert main(["import", str(RELEASE / run / "model_best.pth"), "--out", str(out), "--quiet", "--force"]) == 0
        assert capsys.readouterr().out == f"checkpoint: {out}\n"  # --quiet: the path, no summary
        obj = ckpt.read(out)
        assert obj["source"]["kind"] == "release" and obj["source"]["epoch"] == 0 and obj["epoch"] == 1
        loaded = stability.load(out)
        assert loaded.config.model.window_edges == "shift" and loaded.config.model.norm_eps is None
        ref = reference(run)
        m = copy.deepcopy(loaded.model).double()
        with torch.no_grad():
            logits = release.to_release_layout(m(ref["inputs_stability_layout"].double(), 50))
        assert (logits - ref["logits_float64"]).abs().max() <= 4e-15
        # the file resumes as the trainer resumes: a fresh optimizer state of the right groups, and RNG states
        # that torch takes back (the global one, the data order's generator; no CUDA state from a CPU import)
        from stability.train.loop import make_optimizer

        make_optimizer(loaded.model, loaded.config.train).load_state_dict(obj["optimizer"])
        assert set(obj["rng"]) == {"torch", "cuda", "data"} and list(obj["rng"]["cuda"]) == []
        seed = loaded.config.train.seed
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(obj["rng"]["torch"])
            assert torch.equal(torch.get_rng_state(), torch.manual_seed(seed).get_state())  # seeded by the run
        data = torch.Generator()
        data.set_state(obj["rng"]["data"])
        assert torch.equal(data.get_state(), torch.Generator().manual_seed(seed).get_state())


def test_release_config_may_be_given_explicitly(tmp_path):
    run = RUNS[0]
    pth = tmp_path / "elsewhere.pth"
    shutil.copy(RELEASE / run / "model_best.pth", pth)
    loaded = stability.load(pth, release_config=RELEASE / run / ".hydra" / "config.yaml")
    assert loaded.config.model.attention_window == 5 and loaded.config.model.recall == "external"
    assert loaded.config.task.name == "prefix-sums" and loaded.config.task.hard_length == 512


# ---- every recall × norm of the release grid, against the written-out release forward -------------------------
GRID = list(itertools.product(("internal", "external", "none", "fixed"), ("pre", "peri", "post", "gru")))


def _random_release_checkpoint(tmp_path, recall, norm, board=False, problem=None, seed=0):
    """A release-format run directory made from a random toolkit model (norm gains and GRU weights perturbed)."""
    torch.manual_seed(seed)
    width = 32 if board else 16
    cfg = ModelConfig(recall=recall, norm=norm, width=width, heads=8, depth=3,
                      in_channels=12 if board else 1, out_channels=2, spatial_ndim=2 if board else 1,
                      attention_window=None if board else 5)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    table = release.release_model_table(cfg)
    name = problem or ("sudoku" if board else "prefix_sums")
    run = tmp_path / f"{recall}_{norm}_{name}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"problem": {
        "name": name, "model": table, "hyp": {"lr": 1e-4, "seed": 0},
        **({"train_data": 8, "test_data": 16} if name == "prefix_sums" else {})}}))
    torch.save({"net": release.state_dict_to_release(model), "epoch": 3, "optimizer": {}}, run / "model_best.pth")
    return run, model, table


@pytest.mark.parametrize("recall,norm", GRID)
def test_every_recall_and_norm_of_the_grid_imports_as_the_release_function(recall, norm, tmp_path):
    run, original, table = _random_release_checkpoint(tmp_path, recall, norm)
    loaded = stability.load(run / "model_best.pth")
    assert loaded.config.model.recall == recall and loaded.config.model.norm == norm
    for key, value in original.state_dict().items():  # the weights round-trip unchanged
        assert torch.equal(loaded.model.state_dict()[key], value)
    net = {k: v.double() for k, v in torch.load(run / "model_best.pth", weights_only=True)["net"].items()}
    x = torch.rand(3, 1, 11, dtype=torch.float64) - 0.5  # release layout (B, C, L), ±0.5 bits
    T = 1 if recall == "fixed" else 6
    want = release_forward(net, table, x, T)
    with torch.no_grad():
        got = release.to_release_layout(copy.deepcopy(loaded.model).double()(release.to_stability_layout(x), T))
    assert (got - want).abs().max() <= 1e-14 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("recall,norm", [("internal", "gru"), ("external", "pre"), ("none", "peri")])
def test_boards_with_full_attention_import_as_the_release_function(recall, norm, tmp_path):
    run, _, table = _random_release_checkpoint(tmp_path, recall, norm, board=True)
    loaded = stability.load(run / "model_best.pth")
    net = {k: v.double() for k, v in torch.load(run / "model_best.pth", weights_only=True)["net"].items()}
    x = torch.randn(2, 12, 5, 6, dtype=torch.float64)
    want = release_forward(net, table, x, 4)
    with torch.no_grad():
        got = release.to_release_layout(copy.deepcopy(loaded.model).double()(release.to_stability_layout(x), 4))
    assert (got - want).abs().max() <= 1e-14 * max(1.0, want.abs().max().item())


def test_an_imported_chess_model_reads_this_toolkits_boards_as_the_release_reads_its_own(tmp_path):
    run, _, table = _random_release_checkpoint(tmp_path, "internal", "post", board=True, problem="chess")
    loaded = stability.load(run / "model_best.pth")
    assert loaded.config.model.flip_rows and loaded.config.task.name == "chess"
    net = {k: v.double() for k, v in torch.load(run / "model_best.pth", weights_only=True)["net"].items()}
    ours = torch.randn(2, 8, 8, 12, dtype=torch.float64)  # this toolkit's layout: row 0 = rank 1
    theirs = ours.flip(1).movedim(-1, 1)  # the release's: row 0 = rank 8, channels first
    want = release_forward(net, table, theirs, 3)  # (B, T, C, 8, 8), rows as the release stores them
    with torch.no_grad():
        got = copy.deepcopy(loaded.model).double()(ours, 3)  # (T, B, 8, 8, C), rows as this toolkit stores them
    assert (release.to_release_layout(got).flip(3) - want).abs().max() <= 1e-14 * max(1.0, want.abs().max().item())


# ---- refusals -------------------------------------------------------------------------------------------------
REFUSE = [("ccot", "coconut"), ("num_sinks", 1), ("lanes", 2), ("velocity", 1), ("ema_act", True),
          ("attn_type", "conv"), ("norm_type", "sandwich"), ("residual_method", "lstm"), ("residual_method", "mhc"),
          ("injection_type", "add"), ("injection_type", "concat"), ("init_norm", True), ("noise_prob", 0.1),
          ("post_relu", True), ("hidden_dropout", 0.1), ("local_attn_pad", True), ("norm_before_head", False),
          ("brand_new_option", 1)]


@pytest.mark.parametrize("option,value", REFUSE)
def test_a_release_option_the_toolkit_cannot_represent_is_refused_by_name(option, value, tmp_path, capsys):
    run = release_run_dir(tmp_path, RUNS[0])
    cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    cfg["problem"]["model"][option] = value
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "ours.pt"
    assert main(["import", str(run / "model_best.pth"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err
    assert not out.exists()


def test_gru_residual_outside_peri_norm_is_refused(tmp_path, capsys):
    run = release_run_dir(tmp_path, RUNS[0])
    cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    cfg["problem"]["model"]["residual_method"] = "gru"
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["import", str(run / "model_best.pth"), "--out", str(tmp_path / "o.pt")]) == 2
    err = capsys.readouterr().err
    assert "residual_method=gru" in err and len(err.strip().splitlines()) == 1


def test_missing_config_corrupt_file_and_misused_flag_are_one_line_errors(tmp_path, capsys):
    run = release_run_dir(tmp_path, RUNS[0])
    shutil.rmtree(run / ".hydra")
    out = tmp_path / "ours.pt"
    assert main(["import", str(run / "model_best.pth"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert ".hydra" in err and "--release-config" in err and len(err.splitlines()) == 1

    bad = tmp_path / "corrupt.pth"
    bad.write_bytes((RELEASE / RUNS[0] / "model_best.pth").read_bytes()[:5000])
    assert main(["import", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "corrupt" in err and len(err.splitlines()) == 1

    assert main(["import", str(run / "model_best.pth"), "--out", str(out),
                 "--release-config", str(tmp_path / "nowhere.yaml")]) == 2
    assert "nowhere.yaml" in capsys.readouterr().err
    assert not out.exists()

    not_yaml = tmp_path / "config.yaml"
    not_yaml.write_text("problem: [unclosed\n")
    assert main(["import", str(run / "model_best.pth"), "--out", str(out), "--release-config", str(not_yaml)]) == 2
    assert "YAML" in capsys.readouterr().err


def test_release_config_for_a_toolkit_checkpoint_is_refused(tmp_path):
    from stability.errors import CheckpointError

    from stability.train.release_import import import_checkpoint

    ours = tmp_path / "ours.pt"
    import_checkpoint(RELEASE / RUNS[0] / "model_best.pth", ours)
    with pytest.raises(CheckpointError, match="not a release checkpoint"):
        stability.load(ours, release_config=RELEASE / RUNS[0] / ".hydra" / "config.yaml")


@pytest.mark.slow
def test_analyze_accepts_a_release_checkpoint_and_its_config_flag(tmp_path, capsys):
    pth = tmp_path / "model.pth"
    shutil.copy(RELEASE / RUNS[0] / "model_best.pth", pth)
    cfg = RELEASE / RUNS[0] / ".hydra" / "config.yaml"
    report = tmp_path / "r.json"
    rc = main(["analyze", str(pth), "--release-config", str(cfg), "--split", "val", "--samples", "1",
               "--max-iter", "20", "--iterations", "5", "--probes", "1", "--json", str(report), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    import json

    data = json.loads(report.read_text())
    assert data["config"]["model"]["window_edges"] == "shift"
    assert data["config"]["model"]["attention_window"] == 5


# ---- old checkpoints keep their semantics ---------------------------------------------------------------------
def _toolkit_checkpoint(model, cfg: RunConfig) -> dict:
    return {"format": ckpt.FORMAT, "schema_version": ckpt.SCHEMA_VERSION, "package_version": "0.1.0",
            "torch_version": str(torch.__version__), "config": to_dict(cfg), "model": model.state_dict(),
            "optimizer": {}, "schedule": {}, "rng": {}, "epoch": 1, "step": 1, "history": [],
            "final": None}


def test_a_checkpoint_written_before_the_release_semantics_loads_with_the_legacy_values(tmp_path):
    legacy = ModelConfig(recall="external", norm="post", width=16, heads=2, attention_window=5, norm_eps=1e-6,
                         window_edges="cut", rope_precision="float64")
    torch.manual_seed(0)
    model = build_model(legacy).eval()
    cfg = RunConfig(model=legacy, task=TaskConfig(train_length=8, hard_length=16, train_size=8, val_size=8,
                                                  hard_size=8), train=TrainConfig(epochs=1))
    obj = _toolkit_checkpoint(model, cfg)
    for key in ("window_edges", "rope_precision"):  # keys a schema-1 checkpoint written before them lacks
        del obj["config"]["model"][key]
    path = tmp_path / "old.pt"
    torch.save(obj, path)
    loaded = stability.load(path)
    assert (loaded.config.model.window_edges, loaded.config.model.norm_eps, loaded.config.model.rope_precision) \
        == ("cut", 1e-6, "float64")
    x = torch.rand(2, 9, 1) - 0.5
    with torch.no_grad():
        assert torch.equal(loaded.model(x, 5), model(x, 5))  # the old numbers, bit for bit
        new = build_model(legacy.replace(**release.RELEASE_SEMANTICS)).eval()
        new.load_state_dict(model.state_dict())
        assert (new(x, 5) - model(x, 5)).abs().max() > 1e-4  # and the release semantics would have changed them
    # a checkpoint that predates norm_eps as well gets its legacy 1e-6
    del obj["config"]["model"]["norm_eps"]
    assert ckpt.run_config(obj).model.norm_eps == 1e-6


def test_new_configs_default_to_the_release_semantics():
    cfg = ModelConfig()
    assert (cfg.window_edges, cfg.norm_eps, cfg.rope_precision, cfg.flip_rows) == ("shift", None, "float32", False)
    with pytest.raises(Exception, match="window_edges"):
        ModelConfig(window_edges="pad")
    with pytest.raises(Exception, match="rope_precision"):
        ModelConfig(rope_precision="bfloat16")
    with pytest.raises(Exception, match="norm_eps"):
        ModelConfig(norm_eps=0.0)
    with pytest.raises(Exception, match="flip_rows"):
        ModelConfig(flip_rows=True, spatial_ndim=1)


# ---- shifted windows, in both attention paths ------------------------------------------------------------------
@pytest.mark.parametrize("spatial,window", [((11,), 5), ((4,), 5), ((5, 6), 3), ((4, 7), 5)])
def test_shifted_neighbours_are_the_clamped_window_of_every_axis(spatial, window):
    nb = shifted_neighbours(spatial, window, "cpu")
    mask = _neighbourhood_mask(spatial, window)
    got = torch.zeros_like(mask).scatter_(1, nb, True)
    assert torch.equal(got, mask)
    assert nb.shape[1] == math.prod(min(window, n) for n in spatial)  # every query sees the same number of keys


@pytest.mark.parametrize("spatial", [1, 2])
def test_shifted_windows_agree_between_math_and_fused_paths_and_work_under_torch_func(spatial):
    torch.manual_seed(0)
    cfg = ModelConfig(recall="external", norm="post", width=16, heads=2, spatial_ndim=spatial, attention_window=3,
                      in_channels=1)
    model = build_model(cfg).double().eval()
    shape = (2, 9, 1) if spatial == 1 else (2, 4, 5, 1)
    x0 = model.embed(torch.randn(*shape, dtype=torch.float64))
    x = torch.randn_like(x0)
    model.attention_impl = "math"
    a = model.step(x, x0)
    model.attention_impl = "sdpa"
    b = model.step(x, x0)
    model.attention_impl = "math"
    assert (a - b).abs().max() < 1e-13
    f = lambda z: model.step(z, x0[:1])  # noqa: E731
    z = x[:1]
    J_fwd, J_rev = jacfwd(f)(z), jacrev(f)(z)
    assert (J_fwd - J_rev).abs().max() < 1e-12
    v = torch.randn_like(z)
    _, jv = jvp(f, (z,), (v,))
    assert (jv.reshape(-1) - J_fwd.reshape(z.numel(), z.numel()) @ v.reshape(-1)).abs().max() < 1e-12
    _, pull = vjp(f, z)
    (vj,) = pull(v)
    assert (vj.reshape(-1) - J_fwd.reshape(z.numel(), z.numel()).T @ v.reshape(-1)).abs().max() < 1e-12
    batched = vmap(lambda a_, b_: model.step(a_[None], b_[None])[0])(x, x0)
    assert (batched - a).abs().max() < 1e-13
    # a change at the first token reaches exactly the keys of the shifted windows that contain it
    if spatial == 1:
        x2 = x.clone()
        x2[:, 0] += 1.0
        moved = (model.step(x2, x0) - a).abs().amax(dim=(0, 2)) > 1e-12
        assert moved.tolist() == [True, True, False, False, False, False, False, False, False]


# ---- GRU initialisation -----------------------------------------------------------------------------------------
def test_gru_hidden_weights_start_as_one_orthogonal_matrix_over_all_gates():
    torch.manual_seed(0)
    d = 16
    model = build_model(ModelConfig(recall="external", norm="gru", width=d, heads=2, attention_window=5))
    W = model.block.gru[0].weight_hh.detach().double()  # (3d, d)
    assert (W.T @ W - torch.eye(d, dtype=torch.float64)).abs().max() < 1e-5
    # each gate block alone is not orthogonal: the release does not orthogonalise them one by one
    block = W[:d]
    assert (block.T @ block - torch.eye(d, dtype=torch.float64)).abs().max() > 0.1


# ---- weight decay ------------------------------------------------------------------------------------------------
def test_release_weight_decay_decays_the_head_norm_gain_and_exempts_biases_and_block_norms():
    from stability.train.loop import make_optimizer

    model = build_model(ModelConfig(recall="internal", norm="gru", width=16, heads=2, attention_window=5))
    names = {id(p): n for n, p in model.named_parameters()}
    decayed, free = make_optimizer(model, TrainConfig()).param_groups
    assert decayed["weight_decay"] == 0.01 and free["weight_decay"] == 0.0
    decayed_names = {names[id(p)] for p in decayed["params"]}
    free_names = {names[id(p)] for p in free["params"]}
    assert decayed_names == {n for n, p in model.named_parameters() if p.ndim >= 2} | {"head.norm.weight"}
    assert {"block.pre_norm.0.weight", "block.peri_norm.0.weight", "block.attn.q_norm.weight",
            "block.gru.0.bias_hh", "recall_map.x.bias", "head.fc.bias"} <= free_names
    # the same set by the release's own names: exempt iff the name holds "bias" or "norm"
    to_release = {ours: theirs.replace("._orig_mod.", ".") for ours, theirs in zip(
        model.state_dict(), list(release.state_dict_to_release(model))[1:])}
    assert all(("bias" in to_release[n] or "norm" in to_release[n]) == (n in free_names) for n in names.values())
    legacy_decayed, _ = make_optimizer(model, TrainConfig(decay_exempt="norms")).param_groups
    assert "head.norm.weight" not in {names[id(p)] for p in legacy_decayed["params"]}


def test_a_checkpoint_written_before_decay_exempt_resumes_with_the_legacy_rule():
    cfg = RunConfig(task=TaskConfig(train_length=8, hard_length=16))
    obj = {"config": to_dict(cfg)}
    del obj["config"]["train"]["decay_exempt"]
    assert ckpt.run_config(obj).train.decay_exempt == "norms"
    assert RunConfig().train.decay_exempt == "release"


def test_import_refuses_an_existing_out_in_one_line_unless_forced(tmp_path, capsys):
    out = tmp_path / "ours.pt"
    out.write_bytes(b"an earlier checkpoint")
    src = str(RELEASE / RUNS[0] / "model_best.pth")
    assert main(["import", src, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {out} exists; pass --force" in err[0], err
    assert out.read_bytes() == b"an earlier checkpoint" and os.listdir(tmp_path) == ["ours.pt"]
    assert main(["import", src, "--out", str(out), "--force", "--quiet"]) == 0
    assert ckpt.read(out)["source"]["kind"] == "release"
