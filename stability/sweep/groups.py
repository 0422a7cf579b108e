"""``stability sweep GRID --ensemble auto``: the selected cells that differ only in seed, learning rate and data seed
grouped into one ensemble job each (:func:`stability.train.ensemble.train_members`, one batched step), torch-free.

A group is every selected cell (finished or not) with the same options but ``train.seed``, ``train.lr`` and
``task.seed``, and the same SLURM resources; its job trains the members still without a record, so a resumed group
is the same group, and a member left alone (the others finished) still trains through the ensemble trainer (one
member), never solo on an ensemble's checkpoint. Cells stay solo, each with the reason the sweep prints, when the
batched step does not cover them (:func:`stability.train.batchable.solo_reason`: deep supervision, implicit
training, ``compile``, the noise initial state) or when no other selected cell differs from them only in seed and
rate. ``--ensemble off`` (the default) makes every cell its own job, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stability.config import dotted
from stability.sweep.grid import Cell, digest
from stability.train.batchable import solo_reason

#: the options in which an ensemble's members may differ
MEMBER_OPTIONS = ("train.seed", "train.lr", "task.seed")
#: the reason a cell with no batchable sibling stays solo
ALONE = "no other selected cell differs from it only in seed and learning rate"


@dataclass
class Plan:
    """The sweep's jobs (each a list of cells: one solo cell, or a group's members still to run, in grid order),
    the groups (every selected member of each, by its first cell's id), and the solo cells by reason."""

    jobs: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)
    solo: dict = field(default_factory=dict)

    def note(self, cell: Cell) -> dict | None:
        """The cell's ``ensemble`` note (its group's size, members' readable ids, its index), None when solo."""
        for members in self.groups.values():
            ids = [c.id for c in members]
            if cell.id in ids:
                return {"size": len(members), "members": [c.cell_id or c.id for c in members],
                        "index": ids.index(cell.id)}
        return None


def group_key(cell: Cell) -> str:
    """What the members of one group share: every option but :data:`MEMBER_OPTIONS`, and the SLURM resources."""
    options = {k: v for k, v in dotted(cell.config).items() if k not in MEMBER_OPTIONS}
    return digest({"options": options, "slurm": cell.slurm})


def plan(cells: list, todo: list, mode: str) -> Plan:
    """The jobs running ``todo`` (the selected cells still to run) under ``--ensemble mode``, grouped among
    ``cells`` (all selected cells, finished ones included)."""
    out = Plan()
    if mode == "off":
        out.jobs = [[c] for c in todo]
        return out
    by_key: dict[str, list] = {}
    for cell in cells:
        reason = solo_reason(cell.config)
        if reason is None:
            by_key.setdefault(group_key(cell), []).append(cell)
    for members in by_key.values():
        if len(members) > 1:
            out.groups[members[0].id] = members
    group_of = {c.id: first for first, members in out.groups.items() for c in members}
    pending = {c.id for c in todo}
    started: set = set()
    for cell in todo:
        first = group_of.get(cell.id)
        if first is None:
            out.solo.setdefault(solo_reason(cell.config) or ALONE, []).append(cell)
            out.jobs.append([cell])
        elif first not in started:
            started.add(first)
            out.jobs.append([c for c in out.groups[first] if c.id in pending])
    return out


def fill_workers(jobs: list, slots: int) -> list:
    """``jobs`` with ensemble jobs split so that no worker of ``slots`` sits idle while a group could be shared:
    while there are fewer jobs than slots, the largest job of two or more members is cut into two contiguous
    halves, the larger first, in its place. Each half is trained as a group is (a member's numbers do not depend
    on which members share its batched step: stability/train/split.py); its members keep the whole group's
    ``ensemble`` note. Solo jobs are never cut."""
    jobs = [list(job) for job in jobs]
    while len(jobs) < slots:
        big = max(range(len(jobs)), key=lambda i: len(jobs[i]), default=None)
        if big is None or len(jobs[big]) < 2:
            break
        job = jobs.pop(big)
        half = -(-len(job) // 2)
        jobs[big:big] = [job[:half], job[half:]]
    return jobs


def describe(p: Plan, *, every_group: bool, limit: int = 6) -> list[str]:
    """The lines the sweep prints about ``p``: how many groups and solo cells, each solo reason with its cells,
    and with ``every_group`` (a dry run) each group's members."""

    def names(cells: list) -> str:
        shown = ", ".join(c.cell_id or c.id for c in cells[:limit])
        return shown + (f" and {len(cells) - limit} more" if len(cells) > limit else "")

    grouped = sum(len(m) for m in p.groups.values())
    lines = [f"ensemble auto: {len(p.groups)} group(s) of {grouped} cells, each trained in one process and one "
             f"batched step; {sum(len(c) for c in p.solo.values())} cell(s) to run solo"]
    lines += [f"  solo ({reason}): {names(cells)}" for reason, cells in p.solo.items()]
    if every_group:
        lines += [f"  ensemble of {len(m)}: {names(m)}" for m in p.groups.values()]
    return lines
