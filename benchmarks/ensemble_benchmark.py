"""A K-seed ensemble (`stability train --seeds`) against the K solo runs in sequence, side by side in one run.

    python benchmarks/ensemble_benchmark.py [--seeds 5] [--epochs 45] [--threads 2] [--repeats 3]
                                            [--variants solo,solo1,ensemble,split,fixed,fixed-compiled]
                                            [--out DIR]
    python benchmarks/ensemble_benchmark.py --ceiling [--threads 2] [--out DIR]
    python benchmarks/ensemble_benchmark.py --sensitivity [--seed 1] [--perturbed 4] [--epochs 45] [--out DIR]

The demo's architecture (`--preset cpu`, stability/config.py PRESETS). Up to four variants (``--variants``),
``--repeats`` times, their order rotated each time: ``solo``, the K solo runs in sequence at ``--threads`` threads
each (the goal's baseline); ``solo1``, the same at one thread each (on a small model often the faster baseline);
``ensemble``, the one-process ensemble (``--threads`` threads, ``--processes 1``); ``split``, the ensemble split
across ``--processes`` processes (``--threads`` // processes threads each: what ``stability train --seeds`` runs
by default, ``--processes auto``); ``fixed``, the one-process ensemble with the fixed-shape step
(``--ensemble-step fixed``: every member through all T iterations, masked; stability/train/fixed_step.py), and
``fixed-compiled``, the same compiled (``--compile``: torch.compile's default mode on the CPU, its compilation
counted in the wall seconds and in the first training epoch's). The default ``--variants`` are the
first four (the committed records' set). Prints and writes ``DIR/ensemble.json``: wall seconds of each (whole runs:
training and evaluations; min, median, all) and of its training epochs alone, the ratios baseline / variant for
each solo baseline run, the load average before and after each repetition, and for the last repetition each
member against each solo baseline: its first-epoch loss (relative difference), the first epoch whose loss differs
by more than 1e-4 relative, and its final val / hard accuracy (last iteration; points).

``--sensitivity``: is a member's distance from its solo run the ensemble's doing or the training's own? At one
thread, seed ``--seed``: the solo run; the same run with the members' written-out attention (``dense``) instead of
the fused kernel; the one-member ensemble; and ``--perturbed`` solo runs whose initial weights are multiplied by
1 + 1e-7·N(0, 1) (float32 rounding's size; a seeded draw each). Writes ``DIR/ensemble-sensitivity.json``: each
run's per-epoch losses, the first epoch whose loss parts from the solo run's by more than 1e-4 relative, final val
/ hard accuracy, and the weights' relative distance from the solo run's after every epoch (the one-member ensemble's
from the ``dense`` run's at the end, and whether they are bitwise equal).

``--ceiling``: what batching can buy at all at this size, per batch of the progressive loss at a fixed depth
(n, k) = (4, 4), forward and backward (the median of ``--reps`` timings, writes ``DIR/ensemble-ceiling.json``): one
solo model at batch 50 (sdpa, the solo run's attention; and ``dense``, the members'), the same model at batch
5 × 50 = 250 (one model, 5× the data, the same operations: no stacking scheme can do better than it), the 5-member
batched step (``batched_losses``) and 5 members run one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stability import threads  # noqa: E402 (torch-free; after the path line above)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=None, help="default: the preset's (45)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--processes", type=int, default=None,
                   help="the split ensemble's processes, each with threads // processes threads (default: --threads)")
    p.add_argument("--repeats", type=int, default=1, help="repetitions of the variants (min and median kept)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"which of {','.join(VARIANTS)} to run (a solo baseline among them), comma-separated")
    p.add_argument("--out", default="benchmarks/out")
    p.add_argument("--ceiling", action="store_true", help="per-batch timings: what batching can buy at this size")
    p.add_argument("--reps", type=int, default=15, help="--ceiling: timings per variant (the median is kept)")
    p.add_argument("--sensitivity", action="store_true", help="a member against its solo run's own sensitivity")
    p.add_argument("--seed", type=int, default=1, help="--sensitivity: the seed")
    p.add_argument("--perturbed", type=int, default=4, help="--sensitivity: solo runs perturbed at 1e-7")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not set(args.variants) <= set(VARIANTS) or not set(args.variants) & {"solo", "solo1"}:
        print(f"ensemble_benchmark.py: --variants {','.join(args.variants)}: expected some of {','.join(VARIANTS)}, "
              "a solo baseline among them", file=sys.stderr)
        return 2
    threads.apply()  # OMP_WAIT_POLICY=PASSIVE before torch loads, as the command line does (stability/threads.py)

    import torch

    torch.set_num_threads(args.threads)
    if args.ceiling:
        return ceiling(args)
    if args.sensitivity:
        torch.set_num_threads(1)
        return sensitivity(args)
    return compare(args)


#: the variants, in their order of the first repetition (module docstring)
VARIANTS = ("solo", "solo1", "ensemble", "split", "fixed", "fixed-compiled")
#: the variants run when ``--variants`` is not given (those of the committed records)
DEFAULT_VARIANTS = VARIANTS[:4]
#: the solo baselines among them
BASELINES = ("solo", "solo1")


def _variants(config, seeds, tmp: Path, processes: int, rep: int, names: list) -> dict:
    """One repetition: wall seconds and results of the variants ``names``, in an order rotated by ``rep`` (so no
    variant always runs first on a drifting machine)."""
    import torch

    from stability.train.ensemble import train_ensemble
    from stability.train.loop import train

    def solo(name: str, threads: int):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return [train(config.replace(train=config.train.replace(seed=s)), tmp / f"{name}{rep}-{s}.pt",
                          progress=False) for s in seeds]
        finally:
            torch.set_num_threads(old)

    runs = {"solo": lambda: solo("solo", torch.get_num_threads()), "solo1": lambda: solo("solo1", 1),
            "ensemble": lambda: train_ensemble(config, tmp / f"ens{rep}", seeds, progress=False),
            "split": lambda: train_ensemble(config, tmp / f"split{rep}", seeds, progress=False, processes=processes),
            "fixed": lambda: train_ensemble(config, tmp / f"fixed{rep}", seeds, progress=False, step="fixed"),
            "fixed-compiled": lambda: train_ensemble(config.replace(train=config.train.replace(compile=True)),
                                                     tmp / f"fixedc{rep}", seeds, progress=False, step="fixed")}
    order = [n for n in VARIANTS if n in names]
    order = order[rep % len(order):] + order[:rep % len(order)]
    out = {}
    for name in order:
        t0 = time.perf_counter()
        results = runs[name]()
        out[name] = (time.perf_counter() - t0, results)
    return out


def _epoch_seconds(name: str, results) -> float:
    """The seconds of the training epochs alone (the histories' ``seconds``: no start-up, data, evaluations): the
    solo runs' sum, one member's for the one-process ensemble, the slowest member's for the split one (its
    processes run side by side; the members of one process share its epochs' seconds)."""
    per_member = [sum(h["seconds"] for h in r.history) for r in results]
    one = lambda v: v[0]  # noqa: E731 (the members of one process share its epochs' seconds)
    return {"solo": sum, "solo1": sum, "ensemble": one, "split": max, "fixed": one, "fixed-compiled": one}[name](
        per_member)


def _agreement(seeds, results, solo) -> list[dict]:
    """Each member against its solo run: first-epoch loss (relative), the first epoch whose loss differs by more
    than 1e-4 relative (None: none), final val / hard accuracy (points)."""
    members = []
    for s, a, b in zip(seeds, results, solo):
        rel = [abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(a.history, b.history)]
        members.append({
            "seed": s,
            "first_epoch_loss": [a.history[0]["loss"], b.history[0]["loss"]],
            "first_epoch_rel_diff": rel[0],
            "max_rel_loss_diff_all_epochs": max(rel),
            "parts_at_epoch": next((e + 1 for e, r in enumerate(rel) if r > 1e-4), None),
            **{f"{split}_accuracy": [a.final[split]["accuracy"][-1], b.final[split]["accuracy"][-1]]
               for split in ("val", "hard")},
            **{f"{split}_points": 100 * (a.final[split]["accuracy"][-1] - b.final[split]["accuracy"][-1])
               for split in ("val", "hard")},
        })
    return members


def compare(args) -> int:
    """The variants ``args.variants``, ``--repeats`` times; ratios against each solo baseline run."""
    import torch

    from stability.commands.train import config_from_args

    config = config_from_args(argparse.Namespace(preset="cpu", config=None))
    if args.epochs is not None:
        config = config.replace(train=config.train.replace(epochs=args.epochs))
    seeds = list(range(args.seeds))
    processes = args.processes or min(args.threads, args.seeds)
    names = [n for n in VARIANTS if n in args.variants]
    walls: dict = {n: [] for n in names}
    epochs_s: dict = {n: [] for n in names}
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            got = _variants(config, seeds, Path(tmp), processes, rep, names)
            for name, (seconds, res) in got.items():
                walls[name].append(seconds)
                epochs_s[name].append(_epoch_seconds(name, res))
            load.append(os.getloadavg())
            print(f"repeat {rep + 1}: " + ", ".join(f"{n} {walls[n][-1]:.1f} s" for n in names)
                  + f" (load {load[-1][0]:.1f})", flush=True)
    stats = {n: {"min_s": min(v), "median_s": statistics.median(v), "all_s": v} for n, v in walls.items()}
    train = {n: {"min_s": min(v), "median_s": statistics.median(v), "all_s": v} for n, v in epochs_s.items()}
    pairs = [(b, n) for b in BASELINES if b in names for n in names if n != b and not (b == "solo1" and n == "solo")]
    ratios = {f"{b}/{n}": {k: stats[b][k] / stats[n][k] for k in ("min_s", "median_s")} for b, n in pairs}
    train_ratios = {f"{b}/{n}": {k: train[b][k] / train[n][k] for k in ("min_s", "median_s")} for b, n in pairs}
    result = {"seeds": args.seeds, "epochs": config.train.epochs, "threads": args.threads, "processes": processes,
              "repeats": args.repeats, "variants": names, "torch": torch.__version__, "cpus": os.cpu_count(),
              "loadavg": load, "wall": stats, "ratios": ratios, "training_epochs": train,
              "training_epochs_ratios": train_ratios,
              "members": {f"{n}_vs_{b}": _agreement(seeds, got[n][1], got[b][1]) for b, n in pairs}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ensemble.json").write_text(json.dumps(result, indent=1) + "\n")
    _report(result, pairs)
    return 0


def _report(result: dict, pairs: list) -> None:
    """The ratios and each member's agreement, printed."""
    stats, train_ratios = result["wall"], result["training_epochs_ratios"]
    for b, n in pairs:
        r = result["ratios"][f"{b}/{n}"]
        print(f"{b}/{n}: {n} {stats[n]['min_s']:.1f} s min, {stats[n]['median_s']:.1f} s median; {b} "
              f"{stats[b]['min_s']:.1f} / {stats[b]['median_s']:.1f} s; ratio {r['min_s']:.2f}x (min), "
              f"{r['median_s']:.2f}x (median); training epochs alone {train_ratios[f'{b}/{n}']['min_s']:.2f}x (min), "
              f"{train_ratios[f'{b}/{n}']['median_s']:.2f}x (median)")
        for m in result["members"][f"{n}_vs_{b}"]:
            print(f"  seed {m['seed']}: first-epoch loss rel diff {m['first_epoch_rel_diff']:.1e} (all epochs max "
                  f"{m['max_rel_loss_diff_all_epochs']:.1e}, parts at epoch {m['parts_at_epoch']}); val "
                  f"{m['val_points']:+.2f}, hard {m['hard_points']:+.2f} points vs {b}")


def _solo_traced(config, out: Path, perturb_seed=None, dense: bool = False):
    """A solo run and its flat weights after every epoch; ``perturb_seed``: its initial weights × (1 + 1e-7·N(0, 1))
    from that seed; ``dense``: the members' attention instead of the fused kernel."""
    from unittest import mock

    import torch

    from stability.model import attention
    from stability.train import loop

    start, snaps = loop._start, []

    def perturbed_start(*a, **kw):
        run = start(*a, **kw)
        g = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for q in run.model.parameters():
                q.mul_(1 + 1e-7 * torch.randn(q.shape, generator=g))
        return run

    def dense_sdpa(q, k, v, attn_mask=None):
        return attention._dense_exp_attention(q, k, v, attn_mask)

    with mock.patch.object(loop, "_start", perturbed_start if perturb_seed is not None else start), \
            mock.patch.object(attention.F, "scaled_dot_product_attention",
                              dense_sdpa if dense else attention.F.scaled_dot_product_attention):
        result = loop.train(config, out, progress=False,
                            callbacks=(lambda m, t, r: snaps.append(_flat(m.state_dict())),))
    return result, snaps


def _flat(state: dict):
    import torch

    return torch.cat([v.detach().reshape(-1).double() for v in state.values()])


def sensitivity(args) -> int:
    """The runs of ``--sensitivity`` (module docstring)."""
    import torch

    from stability.commands.train import config_from_args
    from stability.train.ensemble import train_ensemble

    config = config_from_args(argparse.Namespace(preset="cpu", config=None))
    config = config.replace(train=config.train.replace(seed=args.seed, **({"epochs": args.epochs} if args.epochs
                                                                            else {})))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ref, ref_snaps = _solo_traced(config, tmp / "solo.pt")
        runs = {"dense": _solo_traced(config, tmp / "dense.pt", dense=True)}
        runs.update({f"perturbed{i}": _solo_traced(config, tmp / f"p{i}.pt", perturb_seed=i)
                     for i in range(1, args.perturbed + 1)})
        member = train_ensemble(config, tmp / "ens", [args.seed], progress=False, processes=1)[0]
        for name, (result, snaps) in {"solo": (ref, ref_snaps), **runs, "member": (member, None)}.items():
            rel = [abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(result.history, ref.history)]
            out[name] = {"loss": [h["loss"] for h in result.history],
                         "parts_at_epoch": next((e + 1 for e, r in enumerate(rel) if r > 1e-4), None),
                         "val": result.final["val"]["accuracy"][-1], "hard": result.final["hard"]["accuracy"][-1]}
            if snaps is not None:
                out[name]["weights_rel_diff"] = [float((a - b).norm() / b.norm()) for a, b in zip(snaps, ref_snaps)]
        w_member = _flat(torch.load(member.path, weights_only=True)["model"])
        w_dense = _flat(torch.load(tmp / "dense.pt", weights_only=True)["model"])
        out["member"]["bitwise_the_dense_run"] = bool(torch.equal(w_member, w_dense))
        out["member"]["weights_rel_diff_from_dense"] = float((w_member - w_dense).norm() / w_dense.norm())
    result = {"seed": args.seed, "epochs": config.train.epochs, "threads": 1, "torch": torch.__version__,
              "loadavg": os.getloadavg(), "runs": out}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ensemble-sensitivity.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, r in out.items():
        w = r.get("weights_rel_diff")
        at = sorted({e for e in (0, 4, 9, 19) if e < len(w or [])} | ({len(w) - 1} if w else set()))
        print(f"{name}: parts from solo at epoch {r['parts_at_epoch']}, val {r['val']:.3f}, hard {r['hard']:.3f}"
              + (f", weights' distance from solo's after epochs {'/'.join(str(e + 1) for e in at)}: "
                 + "/".join(f"{w[e]:.1e}" for e in at) if w else "")
              + (f", bitwise the dense run: {r['bitwise_the_dense_run']}" if name == "member" else ""))
    return 0


def ceiling(args) -> int:
    """Per-batch milliseconds of the variants in the module docstring (``--ceiling``)."""
    import torch

    from stability.commands.train import config_from_args
    from stability.train import ensemble, loop

    config = config_from_args(argparse.Namespace(preset="cpu", config=None))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [loop._start(c, Path(tmp) / name, resume=False, progress=False)
                for name, c in ensemble.members(config, range(5))]
    task, model = runs[0].task, runs[0].model
    inputs, targets = task.dataset("train")
    B = config.train.batch_size

    def solo(batch: int, impl: str, member=model) -> None:
        member.attention_impl = impl
        loop.progressive_loss(member, task, inputs[:batch], targets[:batch], 4, 4, 1.0, 8).backward()

    def batched() -> None:
        for r in runs:
            r.model.attention_impl = "dense"
        xb, yb = torch.stack([inputs[:B]] * 5), torch.stack([targets[:B]] * 5)
        ensemble.batched_losses(runs, xb, yb, [(4, 4)] * 5).sum().backward()

    def ms(fn) -> float:
        fn()
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
        return statistics.median(times)

    result = {"threads": args.threads, "torch": torch.__version__, "reps": args.reps, "depth": [4, 4],
              "solo_sdpa_ms": ms(lambda: solo(B, "sdpa")), "solo_dense_ms": ms(lambda: solo(B, "dense")),
              "one_model_5x_batch_ms": ms(lambda: solo(5 * B, "dense")), "batched_5_ms": ms(batched),
              "five_in_sequence_ms": ms(lambda: [solo(B, "dense", r.model) for r in runs])}
    result["ceiling_vs_5_solo_sdpa"] = 5 * result["solo_sdpa_ms"] / result["one_model_5x_batch_ms"]
    result["batched_vs_5_solo_sdpa"] = 5 * result["solo_sdpa_ms"] / result["batched_5_ms"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ensemble-ceiling.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
