"""Plain-text summaries of training results."""

from __future__ import annotations

MARKS = (1, 2, 5, 10, 20, 30, 50, 100, 200, 300, 500, 1000)


def accuracy_table(final: dict) -> str:
    """Whole-answer accuracy (%) against iteration count, one column per split; the headline says on how many
    strings of each split (``final[split]["n"]``, where the evaluation recorded it)."""
    splits = [s for s in ("val", "hard") if s in final]
    T = max(len(final[s]["accuracy"]) for s in splits)
    marks = [t for t in MARKS if t <= T] + ([T] if T not in MARKS else [])
    sizes = [f"{s} {final[s]['n']}" for s in splits if final[s].get("n") is not None]
    head = "accuracy (%) against iteration count" + (f" (n = {', '.join(sizes)} strings)" if sizes else "")
    lines = [head, f"{'iteration':>10}" + "".join(f"{s:>10}" for s in splits)]
    for t in marks:
        row = f"{t:>10}"
        for s in splits:
            acc = final[s]["accuracy"]
            row += f"{100 * acc[t - 1]:>10.2f}" if t <= len(acc) else f"{'':>10}"
        lines.append(row)
    return "\n".join(lines)
