"""A request's token mask and logit bias inside the kernels' reads (kernels/common.py
_penalised_tile, kernels/launch.py edit_table), under the interpreter: bit for bit the kernel on
the edited copy of the rows (what gpu_sampler/edits.py applies for the torch twin), on every path
that reads the logits, with the logits still read once."""
import pytest
import torch

from conftest import BACKENDS, DEVICE
from gpu_sampler import pack_mask
from test_kernel_v2 import LogitReads, _run

pytestmark = pytest.mark.skipif("triton" not in BACKENDS or DEVICE != "cpu",
                                reason="interpreter tests (TRITON_INTERPRET=1 on CPU)")

V = 1001  # 16 blocks of 64 (tile=64 below), the last one short


def _edits(B, g):
    """A random mask (~60% allowed) and bias entries spread over the blocks: duplicates (also
    across rows' orders), padding, +-inf, ids in the short last block."""
    from gpu_sampler import edits
    allowed = torch.rand(B, V, generator=g) < 0.6
    allowed[:, 0] = True
    ids = torch.randint(0, V, (B, 24), generator=g)
    ids[:, 1] = ids[:, 0]          # duplicates add up in their order
    ids[:, 2] = -1                 # padding
    ids[:, 3] = V - 1              # the short last block
    vals = torch.randn(B, 24, generator=g) * 2
    vals[0, 4], vals[1, 5] = float("-inf"), float("inf")
    ed = edits.prepare_edits(torch.empty(B, V), pack_mask(allowed), (ids, vals), True)
    return ed, (ids, vals)


def _rows(B, g):
    x = torch.randn(B, V, generator=g) * 2
    x[1, :500] = x[1, :500].round()  # ties
    x[2, 100:900] = float("-inf")
    return x


KW = dict(temperature=torch.tensor([1.0, 0.7, 0.0, 1.0, 0.9]),
          top_k=torch.tensor([0, 40, 0, 0, 0]), top_p=torch.tensor([1.0, 0.9, 1.0, 1.0, 0.8]),
          min_p=torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0]), repetition_penalty=1.3,
          presence_penalty=0.2, seed=torch.arange(5) + 11, offset=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_mask_and_bias_equal_the_edited_rows(dtype, monkeypatch):
    from gpu_sampler import edits
    g = torch.Generator().manual_seed(5)
    x = _rows(5, g).to(dtype)
    ed, _ = _edits(5, g)
    hist = torch.randint(0, V, (5, 12), generator=g)
    kw = dict(KW, input_ids=hist, tile=64)
    edited = edits.apply_edits(x, ed)
    reads_edited, reads = LogitReads(edited, monkeypatch), LogitReads(x, monkeypatch)
    want = _run(edited, **kw)
    fused = dict(allowed_words=ed.words, logit_bias=(ed.bias_ids, ed.bias_values))
    got = _run(x, **fused, **kw)
    # the same passes over the logits as over the edited copy (about one: no edit pass)
    assert reads.bytes / x.element_size() == reads_edited.bytes / 4 <= 1.25 * x.numel()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if dtype == torch.bfloat16:
        return
    p_got = _run(x, write_probs=True, **fused, **kw)
    assert torch.equal(p_got, _run(edits.apply_edits(x, ed), write_probs=True, **kw))
    allowed = edits.apply_edits(torch.zeros(5, V), ed) > float("-inf")
    assert bool((p_got[~allowed] == 0).all())


def test_fused_edits_force_the_row_pass_and_ban_everything():
    """A flat masked row whose nucleus outgrows the candidates takes the merge's row pass with
    the edits applied there too; a row with nothing left is invalid."""
    from gpu_sampler import edits
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, V, generator=g) * 0.1
    allowed = torch.rand(3, V, generator=g) < 0.7
    allowed[2] = False
    ids = torch.tensor([[3, 700, 3], [999, 0, -1], [5, 6, 7]])
    vals = torch.tensor([[1.0, -0.5, 0.25], [0.5, float("-inf"), 0.0], [1.0, 1.0, 1.0]])
    ed = edits.prepare_edits(x, pack_mask(allowed), (ids, vals), False)
    kw = dict(temperature=1.0, top_p=0.99, seed=torch.tensor([1, 2, 3]), tile=64, cand=4)
    got = _run(x, allowed_words=ed.words, logit_bias=(ed.bias_ids, ed.bias_values), **kw)
    want = _run(edits.apply_edits(x, ed), **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[0][2] == -1 and got[0][:2].ge(0).all()


def test_generate_bias_and_bans_through_the_kernel(monkeypatch):
    """generate()'s single-token sequence_bias / bad_words_ids (hf/processors.py TokenEdits)
    reach the kernel as logit_bias: token-identical to model.generate, with a penalty."""
    from gpu_sampler import params
    from gpu_sampler.hf.generation import generate
    from tests.models import tiny_model
    m = tiny_model("llama", seed=11)
    ids = torch.randint(3, 1000, (2, 6), generator=torch.Generator().manual_seed(4))
    base = dict(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    free = m.generate(ids, **base)[:, 6:]
    kw = dict(base, repetition_penalty=1.3, bad_words_ids=[[int(free[0, 3])]],
              sequence_bias={(int(free[0, 1]),): -2.75, (int(free[1, 2]),): -1.3, (17,): 3.1})
    want = m.generate(ids, **kw)
    assert not torch.equal(want[:, 6:], free)  # the edits matter
    monkeypatch.setattr(params, "pick_backend", lambda backend, logits: "triton")
    assert torch.equal(generate(m, ids, **kw), want)


def test_greedy_launch_mask_and_bias_equal_the_edited_rows(monkeypatch):
    """Greedy blocks (kernels/stats.py _block_greedy) apply the mask and bias in their one
    read: the tokens of greedy over the edited copy."""
    from gpu_sampler import edits
    g = torch.Generator().manual_seed(6)
    x = _rows(5, g)
    ed, _ = _edits(5, g)
    edited = edits.apply_edits(x, ed)
    want = _run(edited, temperature=0.0, tile=64)
    reads = LogitReads(x, monkeypatch)
    got = _run(x, allowed_words=ed.words, logit_bias=(ed.bias_ids, ed.bias_values),
               temperature=0.0, tile=64)
    assert reads.bytes == x.numel() * 4
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    valid = ~torch.isnan(edited).any(1) & (edited > float("-inf")).any(1)
    assert torch.equal(want[0], torch.where(valid, edited.argmax(1), -1))
