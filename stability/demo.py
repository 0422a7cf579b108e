"""The demo's run (``stability demo``): a small prefix-sums looped transformer that trains on the CPU in minutes."""

from __future__ import annotations

from typing import Optional

from stability.analysis.report import text_report
from stability.config import RunConfig, preset
from stability.errors import StabilityError
from stability.train.report import accuracy_table


def demo_config():
    """The demo's run: external recall, pre-norm, width 32, 45 epochs of 1,000 11-bit strings at LR 3e-3 (no
    warm-up, cooldown at 80 %), val 200 other 11-bit strings (1,200 distinct strings need 11 bits: val never holds
    a training string), hard split of 16-bit strings, final evaluation to 60 iterations, on the CPU."""
    sections = preset("cpu", "prefix-sums")  # the demo's size is the cpu preset (stability train --preset cpu)
    sections["model"].update(recall="external", norm="pre")
    sections["task"].update(name="prefix-sums")
    return RunConfig(**sections)


#: samples per split the demo analyses
ANALYSIS_SAMPLES = 32


# ---- the README's sample of the demo's output -----------------------------------------------------------------
#: where the README's sample is rendered from: the demo's final accuracy curves and its analysis, as a run on the
#: CPU writes them (deterministic: the same numbers with 1 or 2 threads); `python docs/readme_sample.py` reruns
#: the demo and rewrites it and the README's sample
SAMPLE_RECORD = "docs/demo-sample.json"
#: the README's sample sits between these two lines
SAMPLE_MARKERS = ("<!-- demo-sample: begin (docs/readme_sample.py writes it) -->", "<!-- demo-sample: end -->")


def sample_record(final: dict, report: dict, hardware: Optional[dict] = None) -> dict:
    """The part of a demo run its printed sample is rendered from: the whole-answer accuracy curves of the final
    evaluation, and the analysis JSON without what varies from run to run or only feeds the plots (timings, the
    hardware signature, the checkpoint's path, the per-iteration residual traces). ``hardware``: the signature of
    the training that made the weights (the checkpoint's ``hardware``), kept beside them so that a test knows
    whether a fresh run can give the same bits (:func:`stability.hardware.same_bits_possible`)."""
    import copy

    analysis = copy.deepcopy(report)
    for key in ("timings", "hardware"):
        analysis.pop(key, None)
    analysis["checkpoint"] = "runs/demo/prefix-sums.pt"  # where `stability demo` writes it by default
    for split in analysis.get("splits", []):
        block = analysis[split]
        block.pop("timings", None)
        (block.get("fixed_point") or {}).pop("residual_trace", None)
    return {"format": "stability-demo-sample", "hardware": hardware,
            "final": {s: {"accuracy": list(final[s]["accuracy"]), "n": final[s].get("n")}
                      for s in ("val", "hard") if s in final},
            "analysis": analysis}


def readme_sample(record: dict) -> str:
    """The README's sample of what ``stability demo`` prints: its accuracy table, the analysis report's head,
    verdict and the val split's table (the hard split's table, the JSON and plot lines follow in a real run),
    rendered by the code that prints them."""
    report = text_report(record["analysis"])
    head, sep, _ = report.partition("\n\nsplit: hard")
    lines = [f"checkpoint: {record['analysis']['checkpoint']}", accuracy_table(record["final"]), head.rstrip("\n")]
    if sep:
        lines += ["", "(then the hard split's table, and the json: and plot: lines)"]
    return "\n".join(lines) + "\n"


def readme_block(text: str) -> str:
    """The README's sample: the code block between :data:`SAMPLE_MARKERS` (a StabilityError without them)."""
    begin, end = SAMPLE_MARKERS
    if begin not in text or end not in text:
        raise StabilityError(f"README.md: the markers {begin!r} … {end!r} are missing")
    inner = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    return inner.removeprefix("```").removesuffix("```").strip("\n") + "\n"


def with_sample(text: str, sample: str) -> str:
    """``text`` (the README) with ``sample`` as the code block between :data:`SAMPLE_MARKERS`."""
    begin, end = SAMPLE_MARKERS
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n```\n{sample}```\n{end}{tail}"
