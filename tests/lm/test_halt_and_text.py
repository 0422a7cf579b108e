"""``--text FILE`` (a directory's own tokenizer, built here: no download) and ``stability halt HF_DIR`` (the exit
rules audited per token): the text becomes the right-padded ids its tokenizer gives, analysed as those ids are;
the halt command's audit is the one computed from the model's own passes; bad input is one line and status 2."""

import json
import shutil

import pytest
import torch

from stability.lm.exits import exit_passes, exit_trace
from stability.lm.inputs import unpack
from stability.lm.text import text_inputs
from tests.conftest import run_cli
from tests.lm.conftest import ids, padded_mask

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def text_dir(hrm_dir, tmp_path_factory):
    """The tiny HRM-Text directory with a word-level tokenizer of its own (vocabulary 42 ≤ the model's 48)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("hrm-text") / "model"
    shutil.copytree(hrm_dir, path)
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(path)
    return path


def test_text_is_the_tokenizers_ids_right_padded_with_a_mask(text_dir, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("w3 w5 w7 w1\n\nw9 nope\n", encoding="utf-8")
    ins = unpack(text_inputs(text_dir, f))
    # word i has id i + 2; the unknown word is [UNK] = 1; the blank line is skipped; [PAD] = 0 pads line 2
    assert ins.ids.tolist() == [[5, 7, 9, 3], [11, 1, 0, 0]]
    assert ins.mask.long().tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_analyze_on_text_gives_the_numbers_of_the_same_ids(text_dir, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("w3 w5 w7 w1 w2 w8\nw9 w4 w4\n", encoding="utf-8")
    packed = text_inputs(text_dir, f)
    ins = unpack(packed)
    torch.save({"input_ids": ins.ids, "attention_mask": ins.mask.long()}, tmp_path / "ids.pt")
    common = ["--only", "rho", "--max-iter", "30", "--iterations", "4", "--quiet"]
    run_cli("analyze", text_dir, "--text", f, "--json", tmp_path / "a.json", *common)
    run_cli("analyze", text_dir, "--inputs", tmp_path / "ids.pt", "--json", tmp_path / "b.json", *common)
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert a["lm"]["tokens"]["tokens"] == 6 + 3
    assert a["lm"]["token_rho"]["rho"] == b["lm"]["token_rho"]["rho"]
    assert a["inputs"]["jacobian"]["spectral_radius"] == b["inputs"]["jacobian"]["spectral_radius"]


@pytest.mark.parametrize("case,expected", [
    ("no tokenizer", "holds no tokenizer that loads"),
    ("no file", "--text"),
    ("both", "not both"),
    ("empty", "no line of text"),
])
def test_bad_text_input_is_one_line_and_status_2(hrm_dir, text_dir, tmp_path, case, expected):
    f = tmp_path / "t.txt"
    f.write_text("" if case == "empty" else "w1 w2\n", encoding="utf-8")
    torch.save(ids(1), tmp_path / "ids.pt")
    argv = {"no tokenizer": [hrm_dir, "--text", f], "no file": [text_dir, "--text", tmp_path / "none.txt"],
            "both": [text_dir, "--text", f, "--inputs", tmp_path / "ids.pt"], "empty": [text_dir, "--text", f]}[case]
    for command in ("analyze", "halt"):
        res = run_cli(command, *argv, "--quiet", check=False)
        assert res.returncode == 2, (command, res.stderr)
        assert res.stderr.strip().count("\n") == 0 and expected in res.stderr and "Traceback" not in res.stderr


def test_halt_audits_each_rule_from_the_models_own_passes(hrm_dir, tmp_path):
    """The command's numbers against an independent count: the adapter iterated by hand, each token's first pass
    whose argmax equals the previous pass's (rule argmax, threshold 2), its share of the passes and agreement."""
    import stability

    x = ids(2)
    torch.save({"input_ids": x, "attention_mask": padded_mask(2)}, tmp_path / "ids.pt")
    res = run_cli("halt", hrm_dir, "--inputs", tmp_path / "ids.pt", "--max-iterations", "12", "--tol", "1e-3",
                  "1e-9", "--json", tmp_path / "h.json", "--plots", tmp_path / "plots")
    audit = json.loads((tmp_path / "h.json").read_text())
    assert "exit rules over 12 passes" in res.stdout and audit["passes"] == 12
    assert [r["threshold"] for r in audit["rules"] if r["rule"] == "residual"] == [1e-3, 1e-9]
    assert (tmp_path / "plots" / "exit_rules.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    m = stability.load(hrm_dir).model.double()
    from stability.lm.inputs import pack

    packed = pack(x, padded_mask(2))
    with torch.no_grad():
        x0 = m.embed(packed)
        s = m.initial_state(x0, generator=torch.Generator().manual_seed(0))
        s = m.step(s, x0)
        argmax = []
        for _ in range(12):
            argmax.append(m.readout(s).argmax(-1))
            s = m.step(s, x0)
    A, real = torch.stack(argmax), padded_mask(2).bool()
    first = torch.full(real.shape, 12)
    for k in range(11, 0, -1):  # the first pass k+1 (1-based) whose argmax equals pass k's
        first = torch.where(A[k] == A[k - 1], torch.full_like(first, k + 1), first)
    want_compute = float(first[real].double().mean()) / 12
    answer = A.gather(0, (first - 1).unsqueeze(0)).squeeze(0)
    want_agree = float(((answer == A[-1]) & real).sum()) / int(real.sum())
    row = next(r for r in audit["rules"] if r["rule"] == "argmax" and r["threshold"] == 2)
    assert row["compute"] == pytest.approx(want_compute, abs=1e-12) and row["agreement"] == pytest.approx(want_agree)
    # the audit's own trace gives the same exits (the library path)
    tr = exit_trace(m, x0, m.initial_state(x0, generator=torch.Generator().manual_seed(0)), 12)
    assert torch.equal(exit_passes(tr, "argmax", 2)[real], first[real])
    assert audit["tokens"] == int(real.sum()) == 2 * 8 - 5


def test_halt_refuses_checkpoint_flags_for_a_language_model_and_lm_flags_for_a_checkpoint(hrm_dir, tmp_path):
    torch.save(ids(1), tmp_path / "ids.pt")
    res = run_cli("halt", hrm_dir, "--inputs", tmp_path / "ids.pt", "--split", "hard", check=False)
    assert res.returncode == 2 and "--split applies to checkpoints" in res.stderr
    res = run_cli("halt", hrm_dir, check=False)
    assert res.returncode == 2 and "--inputs FILE.pt or the text with --text FILE" in res.stderr
