"""transformers' own processors as the reference, applied row by row (HF has no per-row params)."""
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


def _ids(input_ids, b):
    """Row b's history without padding (negative ids), as HF's processors want it."""
    if input_ids is None:
        return torch.zeros(1, 0, dtype=torch.long)
    row = input_ids[b]
    return row[row >= 0].unsqueeze(0)


def _row(v, b):
    return v[b].item() if isinstance(v, torch.Tensor) else v


def hf_scores(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
              repetition_penalty=1.0, input_ids=None):
    """Processed fp32 scores from HF's chain, row by row; temperature 0 rows get only the
    repetition penalty (what HF greedy applies)."""
    out = []
    for b in range(logits.shape[0]):
        T, k, p, mp, rp = (_row(temperature, b), _row(top_k, b), _row(top_p, b),
                           _row(min_p, b), _row(repetition_penalty, b))
        procs = LogitsProcessorList()
        if rp != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(float(rp)))
        if T != 0.0:
            if T != 1.0:
                procs.append(TemperatureLogitsWarper(float(T)))
            if k:
                procs.append(TopKLogitsWarper(int(k)))
            if p < 1.0:
                procs.append(TopPLogitsWarper(float(p)))
            if mp:
                procs.append(MinPLogitsWarper(float(mp)))
        out.append(procs(_ids(input_ids, b), logits[b:b + 1].float().clone()))
    return torch.cat(out)


def hf_probs(logits, **kw):
    s = hf_scores(logits, **kw)
    T = kw.get("temperature", 1.0)
    probs = torch.softmax(s, -1)
    greedy = (T == 0) if isinstance(T, torch.Tensor) else torch.full((logits.shape[0],), T == 0)
    onehot = torch.zeros_like(probs).scatter_(1, s.argmax(1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], onehot, probs)


def rule_probs(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
               repetition_penalty=1.0, input_ids=None):
    """The documented rule with float64 masses: the reference where HF's unstable sort decides
    which members of a tie group straddling the top-p cut-off survive. Penalties and
    temperature come from HF's processors; then per row:
        keep x >= k-th largest; keep i iff mass of values strictly above x_i < top_p * Z_k
        (the max and its ties if that keeps nothing); keep exp(x - max) >= min_p."""
    B, V = logits.shape
    out = torch.zeros(B, V, dtype=torch.float64)
    for b in range(B):
        T, k, p, mp, rp = (_row(temperature, b), _row(top_k, b), _row(top_p, b), _row(min_p, b),
                           _row(repetition_penalty, b))
        x = logits[b:b + 1].float().clone()
        if rp != 1.0:
            x = RepetitionPenaltyLogitsProcessor(float(rp))(_ids(input_ids, b), x)
        x = x[0]
        if T == 0:
            out[b, x.argmax()] = 1.0
            continue
        x = x / T
        keep = x > float("-inf")
        if k and k < V:
            keep &= x >= torch.topk(x, k).values[-1]
        e = torch.where(keep, torch.exp((x - x.max()).double()), 0.0)
        if p < 1.0:
            uniq, inv = torch.unique(x, return_inverse=True)  # ascending
            gmass = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, e)
            above = gmass.flip(0).cumsum(0).flip(0) - gmass  # strictly larger values
            kp = keep & (above[inv] < p * e.sum())
            keep = kp if kp.any() else keep & (x == x.max())
        if mp:
            keep &= torch.exp((x - x.max()).double()) >= mp
        e = torch.where(keep, e, 0.0)
        out[b] = e / e.sum()
    return out.float()


def split_tie_rows(logits, ref, *, temperature=1.0, top_p=1.0, repetition_penalty=1.0,
                   input_ids=None, **_):
    """Rows where HF dropped part of the tie group at its cut-off (only top-p can do that)."""
    rows = []
    for b in range(logits.shape[0]):
        if _row(top_p, b) >= 1.0 or _row(temperature, b) == 0:
            continue
        x = hf_scores(logits[b:b + 1], repetition_penalty=_row(repetition_penalty, b),
                      input_ids=None if input_ids is None else input_ids[b:b + 1])[0]
        kept = ref[b] > 0
        boundary = x[kept].min()
        if bool(((x == boundary) & ~kept).any()):
            rows.append(b)
    return rows


ATOL = 2e-6


def assert_same_distribution(ours, ref, what=""):
    supp = (ours > 0) != (ref > 0)
    assert not supp.any(), f"{what}: support differs at {supp.nonzero()[:5].tolist()}"
    err = (ours - ref).abs().max().item()
    assert err <= ATOL * max(1.0, ref.max().item()), f"{what}: max abs diff {err}"


def assert_matches_hf(ours, logits, what="", **kw):
    """Equal to HF's chain; on rows where HF's unstable sort split a tie group at the top-p
    cut-off, equal to the documented rule instead (which keeps or drops a tie group whole)."""
    ref = hf_probs(logits, **kw)
    for b in split_tie_rows(logits, ref, **kw):
        ref[b] = rule_probs(logits[b:b + 1], **{n: (v[b:b + 1] if isinstance(v, torch.Tensor)
                                                     else v) for n, v in kw.items()})[0]
    assert_same_distribution(ours, ref, what)
