"""Tiny random-weight language models for the tests of stability.lm: Inkling-2 Loop and HRM-Text configs built here
and written with ``save_pretrained`` to a temporary directory (never a download), and the reference Huginn."""

import copy

import pytest
import torch

T = 8  # tokens per sequence


def inkling_config(**kw):
    from transformers import Inkling2LoopTextConfig

    c = dict(vocab_size=48, unpadded_vocab_size=48, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, swa_num_attention_heads=2, swa_num_key_value_heads=1,
             swa_head_dim=16, sliding_window_size=4, d_rel=4, rel_extent=8, n_layers_per_attn_res_block=1,
             moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, loop_layer_index_start=1,
             loop_layer_index_end=3, loop_num_passes=3, loop_gate_rank=4, max_position_embeddings=64,
             layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"], eos_token_id=1)
    c.update(kw)
    return Inkling2LoopTextConfig(**c)


def hrm_config(**kw):
    from transformers import HrmTextConfig

    c = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             head_dim=16, H_cycles=2, L_cycles=2, max_position_embeddings=64)
    c.update(kw)
    return HrmTextConfig(**c)


def inkling_model(seed=0, structured=True, **kw):
    """A random Inkling; ``structured``: its zero-initialised parts (the block-attention queries) drawn too and its
    message gates strong enough to matter, a loop map with structure (whose routing keeps changing: it does not
    converge); otherwise as initialised (a strongly contracting loop)."""
    from transformers import Inkling2LoopForCausalLM

    torch.manual_seed(seed)
    m = Inkling2LoopForCausalLM(inkling_config(**kw)).eval()
    if not structured:
        return m
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("query"):
                p.normal_(0, 1.0)
            if "message_gate" in name or "static_weight" in name:
                p.normal_(0, 0.3)
    return m


def hrm_model(seed=0, **kw):
    from transformers import HrmTextForCausalLM

    torch.manual_seed(seed)
    return HrmTextForCausalLM(hrm_config(**kw)).eval()


def ids(B=3, seed=1, vocab=48):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def padded_mask(B=3):
    """Sample 0 left-padded by 3, sample 1 right-padded by 2, the rest unpadded."""
    m = torch.ones(B, T, dtype=torch.long)
    m[0, :3] = 0
    m[1, T - 2:] = 0
    return m


@pytest.fixture(scope="session")
def inkling_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("inkling")
    inkling_model(structured=False).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hrm_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("hrm")
    hrm_model().save_pretrained(path)
    return path


def float64(adapter):
    m = copy.deepcopy(adapter).double().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m
