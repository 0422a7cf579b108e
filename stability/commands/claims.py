"""``stability claims RESULTS``: every registered claim of the paper judged from a sweep's records (issue 27).

Reads the claims file (default ``experiments/claims.toml``), computes each verdict by the file's rule
(:mod:`stability.sweep.claims`) and prints one line per claim: id, verdict, n, effect, CI, p, reason. ``--json``
writes every number; ``--markdown`` the table docs/replication.md includes (generated, never hand-written).
"""

from __future__ import annotations

import argparse

HELP = "judge the paper's registered claims (experiments/claims.toml) from sweep records: verdict, n, effect, CI, p"
DEFAULT_CLAIMS = "experiments/claims.toml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULTS",
                   help="a results directory written by `stability sweep` (records/*.json or records.jsonl), "
                        "or a records .jsonl file")
    p.add_argument("--claims", metavar="FILE", default=None,
                   help=f"the claims file (default {DEFAULT_CLAIMS}, here or in the toolkit's checkout)")
    p.add_argument("--json", metavar="OUT", help="write every verdict with its numbers as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the verdict table (Markdown) for docs/replication.md")


def _claims_path(arg):
    from pathlib import Path

    if arg is not None:
        return Path(arg)
    here = Path(DEFAULT_CLAIMS)
    if here.exists():
        return here
    checkout = Path(__file__).resolve().parents[2] / DEFAULT_CLAIMS  # the toolkit's checkout
    return checkout if checkout.exists() else here


def run(args: argparse.Namespace) -> int:
    from stability import atomic
    from stability.sweep import claims

    path = _claims_path(args.claims)
    outputs = [(atomic.check_writable(o, "file", flag), kind) for o, flag, kind in
               ((args.json, "--json", "json"), (args.markdown, "--markdown", "md")) if o]
    spec, sha = claims.load_claims(path)
    records = claims.read_results(args.results)
    results = claims.evaluate(spec, records)
    meta = dict(claims_path=str(path), sha256=sha, records=len(records), source=str(args.results))
    for line in claims.lines(results):
        print(line)
    counts = {v: sum(r.verdict == v for r in results) for v in ("supported", "contradicted", "inconclusive")}
    print(f"{len(results)} claims from {len(records)} records ({path}, sha256 {sha[:12]}): "
          + ", ".join(f"{n} {v}" for v, n in counts.items()))
    for out, kind in outputs:
        if kind == "json":
            atomic.write_json(out, claims.verdicts_json(spec, results, **meta), indent=2, sort_keys=True)
        else:
            atomic.write_text(out, claims.markdown(spec, results, **meta))
        print(f"wrote {out}")
    return 0
