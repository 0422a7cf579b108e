"""Tables 4, 5 and 6 of the paper (App. B.5–B.6) from sweep records, as Markdown, CSV and LaTeX.

Each entry is the whole-answer ("total") accuracy in percent at the run's test iteration (500 in the paper: the
release reports the iteration-500 accuracy), averaged over seeds, shown with the seed count and the spread
(sample standard deviation; min and max in the CSV). Rows are norm × recall, columns task × learning rate:

* Table 4: validation accuracy; Table 5: hard accuracy. As in the paper, sudoku shows its three highest
  learning rates there when more were run ("sudoku consistently required higher learning rates").
* Table 6: sudoku across all its learning rates, validation (left) and hard (right).

A run that diverged (non-finite loss) counts as 0 % and its entry is marked †. Records that share a cell
(task, norm, recall, lr) must agree on every other option except the seed, or the table would average different
experiments: that is an error naming the option (select with ``--where``).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from stability.atomic import write_text
from stability.config import RunConfig, dotted
from stability.errors import ConfigError
from stability.sweep.grid import _matches, _parse_value, shortest_e
from stability.sweep.record import SweepRecord, typed, written

TASK_ORDER = ("chess", "sudoku", "prefix-sums")
TASK_TITLE = {"chess": "Chess", "sudoku": "Sudoku", "prefix-sums": "Prefix sums"}
RECALL_ORDER = ("internal", "external", "none", "fixed")
#: options that may differ between the seeds of one cell (they do not change the experiment; ``task.seed``: a
#: grid may tie each run's data seed to its seed, issue 38, so the seeds replicate the data too)
IGNORED = {"train.seed", "task.seed", "train.device", "train.compile", "train.eval_batch_size", "train.monitor_every",
           "train.monitor_samples", "train.train_accuracy_samples", "task.data_path", "task.cache_dir", "task.engine"}
KEY = ("task.name", "model.norm", "model.recall", "train.lr")


@dataclass
class Cell:
    """The seeds of one (task, norm, recall, lr): their accuracies (percent) per split."""

    task: str
    norm: str
    recall: str
    lr: float
    values: dict = field(default_factory=lambda: {"val": [], "hard": []})
    seeds: list = field(default_factory=list)
    diverged: int = 0
    test_iterations: set = field(default_factory=set)

    def stats(self, split: str) -> dict:
        v = self.values[split]
        n = len(v)
        mean = sum(v) / n if n else None
        std = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0 if n else None
        return {"mean": mean, "std": std, "min": min(v) if v else None, "max": max(v) if v else None, "n": n}


def _options(config: RunConfig) -> dict:
    """A record's config as ``section.option`` -> value (:func:`stability.config.dotted`; lists as tuples), the
    options as written (:func:`~stability.sweep.record.written`: an option a record predates is absent, not its
    default)."""
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in dotted(written(config)).items()}


def collect(records: list[Union[SweepRecord, dict]]) -> dict[tuple, Cell]:
    """Group records (typed, or their JSON read typed) by (task, norm, recall, lr), checking that the seeds of a
    cell are the same experiment."""
    cells: dict[tuple, Cell] = {}
    reference: dict[tuple, tuple[dict, str]] = {}
    for rec in map(typed, records):
        flat = _options(rec.config)
        key = tuple(flat[k] for k in KEY)
        rest = {k: v for k, v in flat.items() if k not in IGNORED and k not in KEY}
        if key in reference:
            ref, ref_id = reference[key]
            diff = sorted(k for k in set(ref) | set(rest) if ref.get(k) != rest.get(k))
            if diff:
                k = diff[0]
                raise ConfigError(
                    f"records {ref_id} and {rec.id} share the cell {'/'.join(map(str, key))} but differ in "
                    f"{', '.join(diff)} ({ref.get(k)!r} vs {rest.get(k)!r}); a table averages one setting per cell: "
                    f"select one with --where {k}=VALUE")
        else:
            reference[key] = (rest, rec.id)
        cell = cells.setdefault(key, Cell(*key))
        if flat["train.seed"] in cell.seeds:
            raise ConfigError(f"two records of the cell {'/'.join(map(str, key))} have seed {flat['train.seed']} "
                              f"({rec.id} and another): keep one, or select with --where")
        cell.seeds.append(flat["train.seed"])
        if rec.status == "diverged" or not rec.final:
            cell.diverged += 1
            for split in ("val", "hard"):
                cell.values[split].append(0.0)
            continue
        for split in ("val", "hard"):
            cell.values[split].append(100.0 * float(rec.final[split].accuracy))
        cell.test_iterations.add(rec.final["val"].test_iteration)
    return cells


def filter_records(records: list, where: list[str]) -> list:
    """Records (typed or their JSON, given back as given) whose config matches every ``section.option=v1,v2`` (as
    ``stability sweep --where``)."""
    if not where:
        return list(records)
    options = [_options(typed(r).config) for r in records]
    keep = list(range(len(records)))
    for cond in where:
        if "=" not in cond or "." not in cond.split("=", 1)[0]:
            raise ConfigError(f"--where {cond!r}: expected section.option=value[,value...]")
        key, _, raw = cond.partition("=")
        section, _, name = key.strip().partition(".")
        wanted = [_parse_value(v.strip()) for v in raw.split(",")]
        if not any(f"{section}.{name}" in o for o in options):
            raise ConfigError(f"--where {key}: no record has option {key!r}")
        keep = [i for i in keep if _matches(options[i].get(f"{section}.{name}"), wanted)]
    return [records[i] for i in keep]


# ---- layout ------------------------------------------------------------------------------------------------
@dataclass
class Table:
    """A table: title, the (task, lr, split) of each column, the (norm, recall) of each row, and the cells."""

    number: int
    title: str
    columns: list  # (task, lr, split)
    rows: list  # (norm, recall)
    cells: dict
    seeds_common: Optional[int] = None
    test_iterations: list = field(default_factory=list)

    @property
    def stem(self) -> str:
        return f"table{self.number}"


def _lrs(cells: dict, task: str) -> list[float]:
    return sorted({k[3] for k in cells if k[0] == task})


def _rows(cells: dict, tasks) -> list[tuple[str, str]]:
    norms = sorted({k[1] for k in cells if k[0] in tasks})
    recalls = [r for r in RECALL_ORDER if any(k[2] == r and k[0] in tasks for k in cells)]
    return [(n, r) for n in norms for r in recalls]


def _meta(table: Table) -> Table:
    ns = [c.stats("val")["n"] for c in table.cells.values()]
    table.seeds_common = max(ns) if ns else None  # the full seed count; fewer is shown where it occurs
    table.test_iterations = sorted({t for c in table.cells.values() for t in c.test_iterations})
    return table


def build_tables(cells: dict) -> list[Table]:
    """Tables 4 and 5 (every task in the records) and Table 6 (when there are sudoku records)."""
    tasks = [t for t in TASK_ORDER if any(k[0] == t for k in cells)]
    tasks += sorted({k[0] for k in cells} - set(tasks))
    out = []
    main_cols = []
    for task in tasks:
        lrs = _lrs(cells, task)
        if task == "sudoku" and len(lrs) > 3:
            lrs = lrs[-3:]
        main_cols += [(task, lr) for lr in lrs]
    rows = _rows(cells, tasks)
    for number, split, what in ((4, "val", "validation (easy distribution, not trained on)"), (5, "hard", "hard")):
        out.append(_meta(Table(number, f"Accuracy (%) on {what} data", [(t, lr, split) for t, lr in main_cols],
                               rows, cells)))
    if any(k[0] == "sudoku" for k in cells):
        lrs = _lrs(cells, "sudoku")
        cols = [("sudoku", lr, "val") for lr in lrs] + [("sudoku", lr, "hard") for lr in lrs]
        sud = {k: v for k, v in cells.items() if k[0] == "sudoku"}
        out.append(_meta(Table(6, "Validation (left) and hard (right) accuracy (%) for sudoku across all learning "
                                  "rates", cols, _rows(sud, ["sudoku"]), sud)))
    return out


def _mantissa_exponent(lr: float) -> tuple[str, int]:
    """The fewest significant digits that give lr back (2.5e-3 stays 2.5e-3, not 3e-3)."""
    m, e = shortest_e(lr).split("e")
    return m, int(e)


def lr_text(lr: float) -> str:
    m, e = _mantissa_exponent(lr)
    return f"{m}e{e}"


def lr_latex(lr: float) -> str:
    m, e = _mantissa_exponent(lr)
    return f"${m} \\times 10^{{{e}}}$"


def _entry(table: Table, norm: str, recall: str, col) -> tuple[Optional[dict], Optional[Cell]]:
    task, lr, split = col
    cell = table.cells.get((task, norm, recall, lr))
    return (cell.stats(split), cell) if cell else (None, None)


def _caption(table: Table, *, latex: bool = False) -> str:
    T = ", ".join(map(str, table.test_iterations)) or "?"
    n = table.seeds_common
    seeds = (f"{n} seed" if n == 1 else f"{n} seeds") if n else "seeds"
    count = "fewer seeds in parentheses where fewer finished" if latex else "seed count in parentheses"
    dagger = " † includes diverged runs, counted as 0." if any(c.diverged for c in table.cells.values()) else ""
    return ("" if latex else f"Table {table.number}: ") + (
        f"{table.title}, whole-answer accuracy at the test iteration T = {T}; mean ± sample standard deviation "
        f"over {seeds} ({count}).{dagger}")


# ---- Markdown ------------------------------------------------------------------------------------------------
def markdown(table: Table) -> str:
    head = ["Norm", "Recall"] + [f"{TASK_TITLE.get(t, t)} {lr_text(lr)}" + (f" ({s})" if table.number == 6 else "")
                                 for t, lr, s in table.columns]
    lines = [f"**{_caption(table)}**", "", "| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * len(table.columns)) + "|"]
    last_norm = None
    for norm, recall in table.rows:
        row = [norm if norm != last_norm else "", recall]
        last_norm = norm
        for col in table.columns:
            st, cell = _entry(table, norm, recall, col)
            if st is None or st["n"] == 0:
                row.append("–")
                continue
            dag = "†" if cell.diverged else ""
            spread = f" ± {st['std']:.2f}" if st["n"] > 1 else ""
            row.append(f"{st['mean']:.2f}{spread} ({st['n']}){dag}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# ---- CSV -------------------------------------------------------------------------------------------------------
CSV_FIELDS = ("table", "split", "task", "norm", "recall", "lr", "test_iterations", "mean", "std", "min", "max",
              "seeds", "diverged", "values")


def csv_text(table: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for norm, recall in table.rows:
        for col in table.columns:
            st, cell = _entry(table, norm, recall, col)
            if st is None or st["n"] == 0:
                continue
            task, lr, split = col
            w.writerow([table.number, split, task, norm, recall, f"{lr:g}",
                        ";".join(map(str, sorted(cell.test_iterations))), f"{st['mean']:.4f}", f"{st['std']:.4f}",
                        f"{st['min']:.4f}", f"{st['max']:.4f}", st["n"], cell.diverged,
                        ";".join(f"{v:.4f}" for v in cell.values[split])])
    return buf.getvalue()


# ---- LaTeX -----------------------------------------------------------------------------------------------------
def _tex(s: str) -> str:
    return s.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("†", r"$^\dagger$")


def latex(table: Table) -> str:
    """A booktabs table (needs \\usepackage{booktabs})."""
    groups: list[tuple[str, int]] = []
    for t, lr, s in table.columns:
        label = TASK_TITLE.get(t, t) if table.number != 6 else ("Validation" if s == "val" else "Hard")
        if groups and groups[-1][0] == label:
            groups[-1] = (label, groups[-1][1] + 1)
        else:
            groups.append((label, 1))
    spec = "ll" + "".join("r" * n for _, n in groups)
    out = [r"\begin{table}[t]", r"\centering", r"\small",
           rf"\caption{{{_tex(_caption(table, latex=True))}}}", rf"\label{{tab:{table.stem}}}",
           rf"\begin{{tabular}}{{{spec}}}", r"\toprule"]
    out.append(" & & " + " & ".join(rf"\multicolumn{{{n}}}{{c}}{{{_tex(label)}}}" for label, n in groups) + r" \\")
    start, rules = 3, []
    for _, n in groups:
        rules.append(rf"\cmidrule(lr){{{start}-{start + n - 1}}}")
        start += n
    out.append(" ".join(rules))
    out.append("Norm & Recall & " + " & ".join(lr_latex(lr) for _, lr, _ in table.columns) + r" \\")
    out.append(r"\midrule")
    last_norm = None
    for norm, recall in table.rows:
        if last_norm is not None and norm != last_norm:
            out.append(r"\midrule")
        row = [norm if norm != last_norm else "", recall]
        last_norm = norm
        for col in table.columns:
            st, cell = _entry(table, norm, recall, col)
            if st is None or st["n"] == 0:
                row.append("--")
                continue
            text = f"{st['mean']:.2f}"
            if st["n"] > 1:
                text += rf"{{\scriptsize$\pm${st['std']:.2f}}}"
            if st["n"] != table.seeds_common:
                text += f"\\,({st['n']})"
            if cell.diverged:
                text += r"$^\dagger$"
            row.append(text)
        out.append(" & ".join(_tex(r) if i < 2 else r for i, r in enumerate(row)) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


# ---- files --------------------------------------------------------------------------------------------------
def write_tables(records: list, out_dir: Path) -> list[Path]:
    """Write table{4,5,6}.{md,csv,tex} for ``records`` into ``out_dir`` (atomically); returns the paths."""
    out_dir = Path(out_dir)
    paths = []
    for table in build_tables(collect(records)):
        for ext, text in (("md", markdown(table)), ("csv", csv_text(table)), ("tex", latex(table))):
            path = out_dir / f"{table.stem}.{ext}"
            write_text(path, text)
            paths.append(path)
    return paths
