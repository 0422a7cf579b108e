"""Grid files: the paper's experimental grid (App. B.5–B.6) as TOML, validated and expanded into RunConfigs.

A grid file names *fixed* options, shared by every cell, and *axes*, whose Cartesian product gives the cells.
Both are tables of the RunConfig sections ``model``, ``task`` and ``train`` (``stability/config/``)::

    name = "paper-prefix-sums"                # default: the file's stem
    description = "Tables 4-5, prefix sums"

    [fixed.task]
    name = "prefix-sums"
    [fixed.train]
    epochs = 100

    [axes.model]                              # product over axes, in the order they are written
    norm = ["none", "pre", "post", "peri", "gru"]
    recall = ["internal", "external", "none", "fixed"]
    [axes.train]
    lr = [1e-4, 3e-4, 1e-3]
    seed = [0, 1, 2]

    [slurm]                                   # optional: resources of one job (one cell) on SLURM
    partition = "gpu"
    timeout_min = 240

    [summary]                                 # optional: how each cell is summarised (the sweep's options)
    summary = "analyze"                       # or "monitor"
    analyze_samples = 4                       # per split
    analyze_splits = "both"                   # val, hard or both
    analyze_max_iter = 500
    reproducible = true                       # every cell with pinned CPU kernels (README: Reproducibility)
    analyze_geometry = true                   # the analysis adds the geometry stage (docs/analysis.md)
    analyze_path_independence = true          # ... and the path-independence stage (issue 38)
    analyze_drift = true                      # reachability names drifting states (issue 38)
    ensemble = "auto"                         # seeds and rates of one configuration as one batched ensemble

The keys of ``model``, ``task`` and ``train`` are the fields of the one configuration schema
(``stability/config/``, docs/configuration.md). A training method and its options are the ``method`` sub-table
of ``train``, whose ``name`` is the method (as in a run file's ``[train.method]``)::

    [fixed.train.method]
    name = "implicit"
    solver_tol = 1e-4
    [axes.train.method]
    jac_reg = [0.0, 0.1]

Internally, and in ``--where`` filters, an option is named by its path: ``train.lr``, ``train.method.name``,
``train.method.jac_reg`` (:func:`stability.config.dotted`); a readable id names an axis by its last part
(``jac_reg``; the method's name as ``method``). An option of another method than the cell's, or one written
beside the other train options, is an error naming the method and the table that has it.

A file may instead (or also) ``include = ["other.toml", ...]`` (paths relative to it): its cells are the union of
the included grids' cells and its own. The including file's ``fixed`` options apply to the included cells too,
except where an included file makes that option an axis (an error: a fixed option cannot flatten an axis), and
its ``[slurm]`` keys override the included files' (each cell keeps the resources of the file it came from).

Every key is checked: an unknown top-level key, section or option is an error naming the allowed ones, and each
cell's options are validated by the RunConfig itself. Each cell gets a stable id: the task and its axis values,
then ``--`` and the first 10 hex digits of the SHA-1 of its options that differ from the defaults (canonical
JSON of the nested config, :func:`config_hash`), so the same configuration has the same id in every expansion, on
every machine, and in later versions of the toolkit that add options (the file names of its record and
checkpoint). Each cell also gets a short,
readable ``cell_id`` (:func:`short_cell_id`), e.g. ``ps-external-post-lr1e-3-s0``: the task, recall, norm,
learning rate and seed, then the values of the grid's other axes; unique within the grid (a 6-digit hash is
appended where two cells would share one). ``stability sweep GRID --only CELL_ID`` reruns a cell by either id.

``tie = { "task.seed" = "train.seed" }`` sets an option in every cell of that file to another option's value
there (the data seed follows the training seed, so seeds replicate the data too, issue 38); the tied option may
be neither fixed nor an axis, and the option it follows must be one of them.

A grid must define cells: a file with no ``fixed``, ``axes`` or ``include`` (e.g. an empty file) is an error,
not one cell with the paper's full-size defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from stability.config import (METHOD_CLASSES, METHOD_KEYS, SECTIONS, RunConfig, SweepSummary, dotted, from_dict,
                              option_names, parse_toml, section_options, to_dict)
from stability.config import short_number, shortest_e  # noqa: F401 - shortest_e: the tables' import
from stability.errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TOP_KEYS = ("name", "description", "include", "fixed", "axes", "slurm", "summary", "tie")
#: the ``[summary]`` table: how each cell is summarised after training (:class:`stability.config.SweepSummary`; the
#: command line overrides it)
SUMMARY_KEYS = tuple(SweepSummary.model_fields)
#: resources of one SLURM job (submitit's AutoExecutor parameters, without the ``slurm_`` prefix where it has one)
SLURM_KEYS = ("partition", "timeout_min", "gpus_per_node", "cpus_per_task", "mem_gb", "account", "qos",
              "constraint", "array_parallelism", "additional_parameters", "setup")
#: axis names shortened in cell ids (any other axis: the last part of its path, :func:`_label`)
_SHORT = {"task.name": "", "model.recall": "", "model.norm": "", "train.lr": "lr", "train.seed": "seed",
          "train.method.name": "method"}


@dataclass(frozen=True)
class Cell:
    """One run of a grid: its id, the axis values that chose it, its full RunConfig, and the SLURM resources of
    the grid file it came from (not part of the id: where a run happens does not change it)."""

    id: str
    axes: dict
    config: RunConfig
    slurm: dict = field(default_factory=dict)
    cell_id: str = ""  # the short readable id (short_cell_id), unique within its grid

    def to_dict(self) -> dict:
        return {"id": self.id, "cell_id": self.cell_id or self.id, "axes": dict(self.axes),
                "config": to_dict(self.config), "slurm": dict(self.slurm)}

    @staticmethod
    def from_dict(d: dict) -> "Cell":
        return Cell(id=d["id"], axes=dict(d["axes"]), config=from_dict(RunConfig, d["config"]),
                    slurm=dict(d.get("slurm", {})), cell_id=d.get("cell_id", d["id"]))


@dataclass
class Grid:
    """A parsed grid file: its name, the cells it expands into, and its SLURM resources."""

    name: str
    path: Optional[Path]
    description: str = ""
    cells: list = field(default_factory=list)
    slurm: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)  # "section.option" -> values (union over included files)
    summary: dict = field(default_factory=dict)  # the [summary] table (see SUMMARY_KEYS)

    def __len__(self) -> int:
        return len(self.cells)


def _where(path: Optional[Path]) -> str:
    return f"{path}: " if path else ""


def _check_keys(path, what: str, data: dict, allowed) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{_where(path)}{what}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _options(path, what: str, table: Any) -> dict[str, Any]:
    """{"section.option": value} from a table of sections, each option checked against its config class."""
    if not isinstance(table, dict):
        raise ConfigError(f"{_where(path)}{what}: expected a table of sections ({', '.join(SECTIONS)})")
    _check_keys(path, what, table, SECTIONS)
    out = {}
    for section, options in table.items():
        if not isinstance(options, dict):
            raise ConfigError(f"{_where(path)}{what}.{section}: expected a table of options")
        options = section_options(section, options, f"{_where(path)}{what}.{section}")
        for key, value in options.items():
            if section == "train" and key == "method":
                out.update({f"train.method.{k}": v for k, v in value.items()})
            else:
                out[f"{section}.{key}"] = value
    return out


def _label(key: str) -> str:
    """An axis's name in a readable id: the last part of its path (``train.method.jac_reg`` → ``jac_reg``), the
    method's name ``method``."""
    return _SHORT.get(key, key.rsplit(".", 1)[1])


def _short_value(v: Any) -> str:
    if isinstance(v, float):  # 1e-3, 2.5e-3 (not "3e-3")
        return short_number(v)
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (list, tuple)):
        return "-".join(_short_value(x) for x in v)
    return str(v)


def _explicit(values: dict, defaults: dict) -> dict:
    """The entries of ``values`` that differ from ``defaults``, tables compared entry by entry (an empty one left
    out)."""
    out = {}
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):
            sub = _explicit(value, default)
            if sub:
                out[key] = sub
        elif value != default:
            out[key] = value
    return out


def config_hash(config: RunConfig) -> str:
    """SHA-1 (first 10 hex digits) of the canonical JSON of the options that differ from their defaults, per
    section of the nested config: ``{"model": {...}, "task": {...}, "train": {..., "method": {...}}}``, where the
    method table holds its ``name`` if it is not the default method's and its options that differ from that
    method's defaults.

    Leaving defaults out keeps ids stable when a newer version of the toolkit adds an option (with a default that
    keeps the old behaviour), so an upgraded sweep still finds its records; each record stores the full config,
    and the tables refuse to average records of one cell whose configs differ."""
    explicit = {}
    for section, cls in SECTIONS.items():
        defaults = to_dict(cls())
        if section == "train":
            defaults["method"] = {**to_dict(METHOD_CLASSES[config.train.method.name]()),
                                  "name": defaults["method"]["name"]}
        explicit[section] = _explicit(to_dict(getattr(config, section)), defaults)
    return digest(explicit)


def digest(explicit: dict) -> str:
    """The first 10 hex digits of the SHA-1 of ``explicit``'s canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(explicit, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def cell_id(axes: dict, config: RunConfig) -> str:
    """The task, the readable axis values joined by ``_``, then ``--`` and :func:`config_hash` (file-name safe)."""
    parts = [config.task.name]
    for key, value in axes.items():
        if key == "task.name":
            continue
        parts.append(f"{_label(key)}{_short_value(value)}")
    readable = "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", p) for p in parts)
    return f"{readable[:100]}--{config_hash(config)}"


#: task names shortened in readable cell ids
TASK_SHORT = {"prefix-sums": "ps", "sudoku": "sudoku", "chess": "chess"}
#: the options always named in a readable cell id, in this order (then the grid's other axes, sorted)
_ALWAYS = ("model.recall", "model.norm", "train.lr", "train.seed")


def short_cell_id(axes: dict, config: RunConfig) -> str:
    """The readable id of a cell: task, recall, norm, ``lr`` + learning rate, ``s`` + seed, then each other axis
    as its name and value, joined by ``-`` (e.g. ``ps-external-post-lr1e-3-s0``, ``...-s0-width64``)."""
    parts = [TASK_SHORT.get(config.task.name, config.task.name), config.model.recall, config.model.norm,
             f"lr{_short_value(float(config.train.lr))}", f"s{config.train.seed}"]
    for key in sorted(k for k in axes if k not in _ALWAYS and k != "task.name"):
        parts.append(f"{_label(key).replace('_', '')}{_short_value(axes[key])}")
    return "-".join(re.sub(r"[^A-Za-z0-9.+-]+", "", p) for p in parts)


def _assign_cell_ids(cells: list) -> list:
    """Cells with their readable ids, made unique by a 6-digit hash suffix where two would collide."""
    names = [short_cell_id(c.axes, c.config) for c in cells]
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return [dataclasses.replace(c, cell_id=n if counts[n] == 1 else f"{n}-{config_hash(c.config)[:6]}")
            for c, n in zip(cells, names)]


def find_cells(cells: list, wanted: list[str], grid_label: str = "GRID") -> list:
    """The cells named in ``wanted`` (readable ``cell_id`` or full ``id``), in the grid's order; a ConfigError
    naming the first unknown one and how to list the ids."""
    by_name = {c.cell_id: c for c in cells} | {c.id: c for c in cells}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        raise ConfigError(f"--only {unknown[0]}: no such cell in {grid_label}; `stability sweep {grid_label} --list` "
                          "shows the cell ids")
    chosen = {by_name[w].id for w in wanted}
    return [c for c in cells if c.id in chosen]


def _build(path, options: dict[str, Any]) -> RunConfig:
    sections: dict[str, dict] = {s: {} for s in SECTIONS}
    for key, value in options.items():
        *tables, name = key.split(".")
        table = sections
        for t in tables:
            table = table.setdefault(t, {})
        table[name] = value
    try:
        return RunConfig(**{s: from_dict(cls, sections[s]) for s, cls in SECTIONS.items()})
    except ConfigError as exc:
        raise ConfigError(f"{_where(path)}{exc}") from None


def parse(data: dict, *, path: Optional[Path] = None, extra_fixed: Optional[dict] = None,
          _seen: tuple = ()) -> Grid:
    """A Grid from a parsed TOML table (``path`` resolves includes and names errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{_where(path)}a grid file is a TOML table")
    _check_keys(path, "grid", data, TOP_KEYS)
    name = data.get("name", path.stem if path else "grid")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ConfigError(f"{_where(path)}name: {name!r} must be letters, digits, '.', '_' or '-'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{_where(path)}description: expected a string")
    fixed = _options(path, "fixed", data.get("fixed", {}))
    if extra_fixed:
        fixed = {**fixed, **extra_fixed}
    raw_axes = _options(path, "axes", data.get("axes", {}))
    axes: dict[str, list] = {}
    for key, values in raw_axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{_where(path)}axes.{key}: expected a non-empty list of values")
        keyed = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(keyed)) != len(keyed):
            raise ConfigError(f"{_where(path)}axes.{key}: repeated value in {values}")
        if key in fixed:
            raise ConfigError(f"{_where(path)}{key} is both fixed and an axis; choose one")
        axes[key] = values
    slurm = data.get("slurm", {})
    if not isinstance(slurm, dict):
        raise ConfigError(f"{_where(path)}slurm: expected a table")
    _check_keys(path, "slurm", slurm, SLURM_KEYS)

    summary = data.get("summary", {})
    if not isinstance(summary, dict):
        raise ConfigError(f"{_where(path)}summary: expected a table")
    _check_keys(path, "summary", summary, SUMMARY_KEYS)
    try:
        SweepSummary(**summary)
    except ConfigError as exc:
        raise ConfigError(f"{_where(path)}{exc}") from None
    tie = _ties(path, data.get("tie", {}), fixed, axes)
    grid = Grid(name=name, path=path, description=description, slurm=dict(slurm),
                axes={k: list(v) for k, v in axes.items()}, summary=dict(summary))
    includes = data.get("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{_where(path)}include: expected a list of grid files")
    seen_ids: set[str] = set()
    for inc in includes:
        inc_path = (path.parent / inc) if path else Path(inc)
        sub = load(inc_path, extra_fixed=fixed, _seen=_seen + ((path.resolve(),) if path else ()))
        for key, values in sub.axes.items():
            grid.axes.setdefault(key, [])
            grid.axes[key] += [v for v in values if v not in grid.axes[key]]
        for cell in sub.cells:
            if cell.id not in seen_ids:
                seen_ids.add(cell.id)
                grid.cells.append(dataclasses.replace(cell, slurm={**cell.slurm, **grid.slurm}))
    if not includes and not axes and not data.get("fixed"):
        raise ConfigError(f"{_where(path)}the grid defines no cells: give [fixed.*] options, [axes.*] lists or an "
                          "include (an empty grid would be one run at the paper's full-size defaults)")
    if axes or not includes:
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            chosen = dict(zip(keys, combo))
            options = {**fixed, **chosen}
            config = _build(path, {**options, **{k: options[src] for k, src in tie.items()}})
            cell = Cell(id=cell_id(chosen, config), axes=chosen, config=config, slurm=dict(grid.slurm))
            if cell.id not in seen_ids:
                seen_ids.add(cell.id)
                grid.cells.append(cell)
    if not _seen:  # the top-level file: readable ids over the whole grid
        grid.cells = _assign_cell_ids(grid.cells)
    return grid


def _ties(path, tie: Any, fixed: dict, axes: dict) -> dict:
    """The ``tie`` table checked: {"section.option": "section.option it follows"}, each a known option, the tied
    one neither fixed nor an axis, the followed one fixed or an axis."""
    if not isinstance(tie, dict):
        raise ConfigError(f"{_where(path)}tie: expected a table of \"section.option\" = \"section.option\"")
    for key, src in tie.items():
        for name in (key, src):
            section, _, option = str(name).partition(".")
            if section not in SECTIONS or option not in option_names(section):
                raise ConfigError(f"{_where(path)}tie.{key}: {name!r} is not an option (section.option)")
        if key in fixed or key in axes:
            raise ConfigError(f"{_where(path)}tie.{key}: the tied option is also fixed or an axis; choose one")
        if src not in fixed and src not in axes:
            raise ConfigError(f"{_where(path)}tie.{key}: follows {src}, which is neither fixed nor an axis here")
    return dict(tie)


def load(path: Path | str, *, extra_fixed: Optional[dict] = None, _seen: tuple = ()) -> Grid:
    """Read and expand a grid file (see the module docstring); one-line ConfigError on any bad content."""
    path = Path(path)
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: included twice in a chain of includes (a cycle)")
    if not path.exists():
        raise ConfigError(f"{path}: no such grid file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a grid file")
    data = parse_toml(path, str(path))
    if extra_fixed:
        # an including file's fixed options may not flatten an axis of this one
        own_axes = _options(path, "axes", data.get("axes", {}))
        clash = sorted(set(extra_fixed) & set(own_axes))
        if clash:
            raise ConfigError(f"{path}: {', '.join(clash)} is an axis here but fixed by the including grid")
    return parse(data, path=path, extra_fixed=extra_fixed, _seen=_seen)


def select(cells: list, where: list[str]) -> list:
    """Cells whose options match every ``section.option=v1,v2`` filter (values compared as the config holds them)."""
    out = list(cells)
    for cond in where:
        if "=" not in cond:
            raise ConfigError(f"--where {cond!r}: expected section.option=value[,value...]")
        key, _, raw = cond.partition("=")
        key = key.strip()
        section, _, name = key.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"--where {key}: unknown section {section!r}; allowed: {', '.join(SECTIONS)}")
        allowed = [m for n in option_names(section) for m in ([f"method.{k}" for k in METHOD_KEYS]
                                                             if (section, n) == ("train", "method") else [n])]
        if name not in allowed:
            raise ConfigError(f"--where {key}: unknown option {name!r}; allowed: {', '.join(allowed)}")
        wanted = [_parse_value(v.strip()) for v in raw.split(",")]
        out = [c for c in out if _matches(dotted(c.config).get(key), wanted)]
    return out


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _matches(value: Any, wanted: list) -> bool:
    for w in wanted:
        if isinstance(value, float) and isinstance(w, (int, float)) and not isinstance(w, bool):
            if abs(value - w) <= 1e-12 * max(abs(value), abs(w), 1e-300):
                return True
        elif value == w or str(value) == str(w):
            return True
    return False
