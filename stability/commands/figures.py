"""``stability figures [--out DIR] [--only NAME ...]``: regenerate the paper's theory figures and Table 3 (into
``runs/figures`` unless ``--out`` says where; ``--out figures`` rewrites the repository's committed copies).

Every output is produced by one entry of :data:`FIGURES`: a name, a one-line description and a builder
``build(out_dir, args) -> list[Path]`` that writes its files (atomically) and returns them. A result-driven figure
(e.g. from ``--results DIR`` of a sweep or ``--run CKPT`` of a trained model) is one more entry whose builder reads
what it needs from ``args``, plus its option in :func:`add_arguments`; entries whose inputs are not given are
skipped by :func:`selected` (see ``needs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from stability.analysis.options import AnalysisOptions
from stability.analysis.report import region_axes
from stability.analysis.stages import geometry
from stability.atomic import output_dir
from stability.errors import ConfigError
from stability.sweep.figures import results_figures, run_figures

HELP = ("regenerate the theory figures (Fig. 2, Fig. 5) and Table 3; with --results / --run / --region, the "
        "result-driven figures of a sweep or one run")


@dataclass(frozen=True)
class FigureSpec:
    """One output group of ``stability figures``; ``needs`` names the args attributes it requires (none: always)."""

    description: str
    build: Callable[[Path, object], list[Path]]
    needs: tuple[str, ...] = field(default=())


def _fig2(out: Path, args) -> list[Path]:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.theory import figures

    return figures.save_figure(figures.phase_portraits(), out, "fig2_phase_portraits")


def _fig5(out: Path, args) -> list[Path]:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.theory import figures

    return figures.save_figure(figures.stability_regions(), out, "fig5_stability_regions")


def _table3(out: Path, args) -> list[Path]:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.theory import figures, regions

    paths = figures.write_table3(out, regions.anisotropy())
    return paths + figures.save_figure(figures.anisotropy_points(), out, "table3_anisotropy_points")


def _results(out: Path, args) -> list[Path]:
    results = Path(args.results)
    if not results.is_dir():
        raise ConfigError(f"--results {results}: no such directory of sweep records")
    return results_figures(results, out, log=lambda msg: print(f"results  {msg}"))


def _run(out: Path, args) -> list[Path]:
    return run_figures(Path(args.run), out)


def _region(out: Path, args) -> list[Path]:
    """The stability region of a trained checkpoint (the geometry stage's plane, val and hard), beside Figure 5."""
    # lazy: torch; `stability --help` imports this module without it
    from stability.analysis.pipeline import analyze_checkpoint
    from stability.theory.figures import _figure, save_figure

    ckpt = Path(args.region)
    opts = AnalysisOptions(samples=1, stages=(geometry.NAME,), geometry_plane=21, geometry_group_directions=0)
    report = analyze_checkpoint(ckpt, splits=("val", "hard"), options=opts).to_json()
    fig = _figure(figsize=(11.5, 5.0), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    for ax, split in zip(axes, ("val", "hard")):
        geo = report[split][geometry.KEY]
        if geo.get("plane"):
            region_axes(ax, geo, f"{split}: stability region around θ* (sample {geo['plane'].get('sample')})")
        else:
            ax.text(0.5, 0.5, "x* does not attract at θ*: no region", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_title(split)
    fig.suptitle(f"{ckpt.name}: ρ(J*) over θ* + a·D1 + b·D2 (compare Figure 5)", fontsize=10)
    return save_figure(fig, out, f"geometry_region_{ckpt.stem}")


FIGURES: dict[str, FigureSpec] = {
    "fig2": FigureSpec("Figure 2: phase portraits of (x, y) -> (λx x, λy y), stable and saddle cases", _fig2),
    "fig5": FigureSpec("Figure 5: stable regions of external and internal recall over λg × λh", _fig5),
    "table3": FigureSpec("Table 3: anisotropy of projected points (anisotropy.json/.md/.tex and a scatter)", _table3),
    "results": FigureSpec("Figures 3, 6, 7 and their ρ(J*) versions from a sweep's records (--results DIR)",
                          _results, needs=("results",)),
    "run": FigureSpec("the stability monitor against epoch for one checkpoint (--run CKPT)", _run, needs=("run",)),
    "region": FigureSpec("the stability region in parameter space of one checkpoint, beside Figure 5 (--region CKPT)",
                         _region, needs=("region",)),
}


#: where figures go unless --out says otherwise: under runs/, which .gitignore leaves out, so a plain `stability
#: figures` never overwrites the committed figures/ of the repository
DEFAULT_OUT = "runs/figures"


def add_arguments(parser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"directory to write into (created if missing; default: {DEFAULT_OUT}, an untracked "
                             "folder; --out figures regenerates the repository's committed copies)")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=None,
                        help=f"build only these ({', '.join(FIGURES)})")
    parser.add_argument("--results", metavar="DIR", default=None,
                        help="a sweep's results directory: adds the result-driven Figures 3, 6, 7")
    parser.add_argument("--run", metavar="CKPT", default=None,
                        help="a checkpoint trained with --monitor-every: adds its stability-monitor plot")
    parser.add_argument("--region", metavar="CKPT", default=None,
                        help="a checkpoint: adds its stability region (ρ(J*) over a plane of two random directions in "
                             "parameter space, the geometry stage of stability analyze)")


def selected(args) -> list[str]:
    """The figure names to build: ``--only`` (validated) or every entry whose ``needs`` are present in ``args``."""
    if args.only:
        unknown = [n for n in args.only if n not in FIGURES]
        if unknown:
            raise ConfigError(f"unknown figure {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
        for name in args.only:
            missing = [need for need in FIGURES[name].needs if not getattr(args, need, None)]
            if missing:
                raise ConfigError(f"figure {name} needs --{missing[0]}")
        return list(dict.fromkeys(args.only))
    return [n for n, spec in FIGURES.items() if all(getattr(args, need, None) for need in spec.needs)]


def run(args) -> int:
    names = selected(args)
    import matplotlib

    matplotlib.use("Agg")
    with output_dir(args.out, "--out") as out:  # a failure before any file is written leaves no empty folder
        for name in names:
            for path in FIGURES[name].build(out, args):
                print(f"{name:8s} {path}")
    return 0
