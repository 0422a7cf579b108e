"""The README's sample of what ``stability demo`` prints, generated from the code.

    python docs/readme_sample.py            # rerun the demo (about 90 CPU-seconds), store what its sample is
                                            # rendered from in docs/demo-sample.json, rewrite the README's sample
    python docs/readme_sample.py --render   # only re-render the README's sample from docs/demo-sample.json
    python docs/readme_sample.py --check    # exit 1 if the README's sample is not what the code prints

Run it (without options) after any change to what the demo computes or prints; ``tests/cli/test_faults.py`` fails
while the README's sample differs from what the code renders for docs/demo-sample.json, and the slow demo test
(tests/train/test_train.py) fails while a fresh demo run renders another sample. The demo is deterministic on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_demo() -> dict:
    """A fresh demo run in a temporary folder, reduced to what its sample is rendered from."""
    import torch

    from stability.cli import main
    from stability.demo import sample_record

    with tempfile.TemporaryDirectory() as d:
        if main(["demo", "--out", d, "--quiet"]) != 0:
            raise SystemExit("stability demo failed")
        ckpt = torch.load(Path(d) / "prefix-sums.pt", weights_only=True)
        report = json.loads((Path(d) / "analysis.json").read_text())
    return sample_record(ckpt["final"], report, ckpt.get("hardware"))


def main(argv=None) -> int:
    from stability import atomic
    from stability.demo import SAMPLE_RECORD, readme_block, readme_sample, with_sample

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--render", action="store_true", help="only re-render the README from the stored record")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's sample is not the code's")
    args = p.parse_args(argv)
    readme, record_path = ROOT / "README.md", ROOT / SAMPLE_RECORD
    if not (args.render or args.check):
        atomic.write_json(record_path, run_demo())
    sample = readme_sample(json.loads(record_path.read_text()))
    text = readme.read_text(encoding="utf-8")
    if args.check:
        if readme_block(text) != sample:
            print("README.md: the demo sample differs from what the code prints; run python docs/readme_sample.py "
                  "--render", file=sys.stderr)
            return 1
        return 0
    atomic.write_text(readme, with_sample(text, sample))
    print(f"README.md: sample rewritten from {SAMPLE_RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
