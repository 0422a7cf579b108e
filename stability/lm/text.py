"""Text as token ids: ``--text FILE`` with a ``save_pretrained`` directory's own tokenizer (never a download).

One sequence a line (blank lines skipped), each encoded by the directory's tokenizer
(``transformers.AutoTokenizer.from_pretrained(dir, local_files_only=True)``, its special tokens added as it adds
them), the batch right-padded to the longest with the tokenizer's pad token (else its end-of-sequence token, else
0) and an attention mask of 0 there: pads are left out of every statistic and never scored, so where a sequence
is padded does not change its numbers (tests/lm/test_tokens.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from stability.errors import StabilityError
from stability.extras import require
from stability.lm.inputs import pack


def read_lines(path) -> list:
    """The non-blank lines of the text file ``path`` (checked before any model is loaded)."""
    p = Path(path)
    if not p.is_file():
        raise StabilityError(f"--text {path}: no such file")
    try:
        lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise StabilityError(f"--text {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not lines:
        raise StabilityError(f"--text {path}: no line of text (one sequence a line)")
    return lines


def load_tokenizer(directory):
    """The tokenizer saved in ``directory``; one line naming the directory where it holds none."""
    transformers = require("transformers", "reading a Hugging Face tokenizer")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise StabilityError(f"{directory} holds no tokenizer that loads ({str(exc).splitlines()[0][:120]}): give "
                             "token ids with --inputs FILE.pt instead of --text") from None


def text_inputs(directory, path) -> torch.Tensor:
    """Packed inputs (B, 3, T) of the lines of ``path`` encoded by ``directory``'s tokenizer (module docstring)."""
    lines = read_lines(path)
    tok = load_tokenizer(directory)
    encoded = [list(tok(line)["input_ids"]) for line in lines]
    empty = [i + 1 for i, e in enumerate(encoded) if not e]
    if empty:
        raise StabilityError(f"--text {path}: line {empty[0]} encodes to no token")
    pad = next((t for t in (tok.pad_token_id, tok.eos_token_id) if t is not None), 0)
    T = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), T), int(pad), dtype=torch.long)
    mask = torch.zeros(len(encoded), T, dtype=torch.long)
    for b, e in enumerate(encoded):
        ids[b, :len(e)] = torch.tensor(e, dtype=torch.long)
        mask[b, :len(e)] = 1
    return pack(ids, mask)
