"""``stability claims RESULTS``: every registered claim of the paper judged from a sweep's records (issue 27).

Reads the claims file (default ``experiments/claims.toml``), computes each verdict by the file's rule
(:mod:`stability.sweep.claims`) and prints one line per claim: id, verdict, n, effect, CI, p, the direction its
one-sided test took and on which side of it the effect lies, and the reason. ``--json`` writes every number;
``--markdown`` the table docs/replication.md includes (generated, never hand-written); ``--figures DIR`` one figure
per claim (:mod:`stability.sweep.claim_figures`). A version-2 file (``experiments/claims-v2.toml``, issue 38) is
judged by :mod:`stability.sweep.claims.frame` instead: configurations (runs), effect, 95 % CI, raw and Holm p.
"""

from __future__ import annotations

import argparse

from stability import atomic
from stability.errors import StabilityError

HELP = "judge the paper's registered claims (experiments/claims.toml) from sweep records: verdict, n, effect, CI, p"
DEFAULT_CLAIMS = "experiments/claims.toml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULTS",
                   help="a results directory written by `stability sweep` (records/*.json or records.jsonl), "
                        "or a records .jsonl file")
    p.add_argument("--claims", metavar="FILE", default=None,
                   help=f"the claims file (default {DEFAULT_CLAIMS}, here or in the toolkit's checkout)")
    p.add_argument("--json", metavar="OUT", help="write every verdict with its numbers as JSON")
    p.add_argument("--markdown", metavar="OUT", action="append", help="write the verdict table (Markdown); in a page "
                   "with generated "
                   "claims blocks of RESULTS (<!-- stability claims RESULTS: begin [compact] --> ... <!-- stability "
                   "claims: end -->), re-render those blocks and keep the rest of the page; repeatable (several pages)")
    p.add_argument("--figures", metavar="DIR", help="write one figure per claim (DIR/<claim id>.png): every unit's "
                                                   "value as the test sees it, with the verdict, n, effect, CI and p")


def _claims_path(arg):
    from pathlib import Path

    if arg is not None:
        return Path(arg)
    here = Path(DEFAULT_CLAIMS)
    if here.exists():
        return here
    checkout = Path(__file__).resolve().parents[2] / DEFAULT_CLAIMS  # the toolkit's checkout
    return checkout if checkout.exists() else here


def _markdown(out, spec, results, meta) -> str:
    """The whole table as a new file; in a page with generated blocks (``<!-- stability claims RESULTS: begin
    [compact] -->`` ... ``<!-- stability claims: end -->``), those of these results re-rendered and the rest of the
    page kept as it is."""
    # lazy: numpy; `stability --help` imports this module without it
    from pathlib import Path

    from stability.sweep import claims

    out = Path(out)
    text = out.read_text(encoding="utf-8") if out.is_file() else ""
    blocks = claims.generated_blocks(text)
    full, compact_table = _renderers(spec.version)
    if not blocks:
        return full(spec, results, **meta)
    mine = Path(meta["source"])
    if not any(Path(src) == mine for src, _ in blocks):
        raise StabilityError(f"{out}: its generated claims blocks are of {', '.join(sorted({s for s, _ in blocks}))}, "
                             f"not of {meta['source']}")

    def render(source: str, compact: bool) -> str:
        if Path(source) != mine:
            return None
        m = dict(meta, source=source)
        if compact:
            return compact_table(results, records=m["records"], source=source, sha256=m["sha256"])
        return full(spec, results, **m)

    return claims.splice(text, render)


def _renderers(version: int):
    """(the full table, the compact one) of a claims file's version: version 2's frame has its own columns."""
    # lazy: numpy; `stability --help` imports this module without it
    from stability.sweep import claims
    from stability.sweep.claims import frame

    if version == 2:
        return frame.frame_markdown, frame.frame_compact
    return claims.markdown, claims.compact_markdown


def run(args: argparse.Namespace) -> int:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.sweep import claims
    from stability.sweep.claims import frame

    path = _claims_path(args.claims)
    outputs = [(atomic.check_writable(o, "file", flag), kind) for o, flag, kind in
               [(args.json, "--json", "json")] + [(m, "--markdown", "md") for m in args.markdown or ()] if o]
    if args.figures:
        atomic.check_writable(args.figures, "dir", "--figures")
    spec, sha = claims.load_claims(path)
    if args.figures and spec.version == 2:
        raise StabilityError(f"--figures: the per-claim figures draw version-1 claims; {path} is version 2")
    records = claims.read_results(args.results)
    results = frame.evaluate_v2(spec, records) if spec.version == 2 else claims.evaluate(spec, records)
    meta = dict(claims_path=str(path), sha256=sha, records=len(records), source=str(args.results))
    for line in (frame.frame_lines if spec.version == 2 else claims.lines)(results, spec.claim):
        print(line)
    counts = {v: sum(r.verdict == v for r in results) for v in ("supported", "contradicted", "inconclusive")}
    print(f"{len(results)} claims from {len(records)} records ({path}, sha256 {sha[:12]}): "
          + ", ".join(f"{n} {v}" for v, n in counts.items()))
    for out, kind in outputs:
        if kind == "json":
            as_json = frame.frame_json if spec.version == 2 else claims.verdicts_json
            atomic.write_json(out, as_json(spec, results, **meta), indent=2, sort_keys=True)
        else:
            atomic.write_text(out, _markdown(out, spec, results, meta))
        print(f"wrote {out}")
    if args.figures:
        # lazy: numpy; `stability --help` imports this module without it
        from stability.sweep.claim_figures import draw_all

        with atomic.staged_dir(args.figures) as stage:
            written = draw_all(spec, results, stage)
        print(f"wrote {len(written)} figures to {args.figures}")
    return 0
