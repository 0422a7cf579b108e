"""The optional packages: what the analysis core does without, and the one line said when one is missing.

``import stability``, ``stability.load`` / ``stability.analyze``, ``stability train`` and ``stability analyze`` need
only the core dependencies. Each extra of ``pyproject.toml`` serves one room:

* ``data``: python-chess (the chess task's puzzles: generating them, reading a Lichess CSV) and numba (the sudoku
  solver compiled; without it the same solver runs in pure Python, same puzzles, much slower);
* ``sweep``: submitit (``stability sweep --executor slurm``);
* ``theory``: sympy (the symbolic rows of ``stability verify``, :mod:`stability.theory.symbolic`);
* ``lm``: transformers (Hugging Face looped language models: ``stability.load(HF_DIR)``, :mod:`stability.lm`).

The ``test`` extra pulls in all of them.
"""

from __future__ import annotations

import importlib
import sys

from stability.errors import MissingExtraError, first_line

#: optional top-level module -> (the extra that installs it, its distribution's name)
EXTRAS = {"chess": ("data", "python-chess"), "numba": ("data", "numba"), "submitit": ("sweep", "submitit"),
          "sympy": ("theory", "sympy"), "transformers": ("lm", "transformers")}


def missing_extra(module: str, purpose: str, cause: BaseException | None = None) -> MissingExtraError:
    """The error for ``purpose`` lacking the optional ``module``: one line naming the pip command."""
    top = module.split(".")[0]
    extra, dist = EXTRAS[top]
    why = f" ({first_line(cause)})" if cause is not None else ""
    return MissingExtraError(f"{purpose} needs the optional package {dist}{why}: pip install 'stability[{extra}]'")


def require(module: str, purpose: str):
    """Import the optional ``module`` and return its top-level package (as ``import a.b`` binds ``a``), or raise
    :class:`~stability.errors.MissingExtraError` saying which extra installs it."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise missing_extra(module, purpose, exc) from exc
    return sys.modules[module.split(".")[0]]
