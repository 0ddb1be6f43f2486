"""One chi-square rule for the sampling tests: draws against the exact distribution."""
import torch
from scipy import stats


def pvalue(draws, probs):
    """Chi-square p-value of ``draws`` (int [n]) as samples of ``probs`` (float [V]); asserts
    that no draw lies outside the support. Cells with fewer than 5 expected draws are pooled,
    so the approximation holds."""
    counts = torch.bincount(draws.reshape(-1).cpu(), minlength=probs.numel()).double()
    expected = probs.reshape(-1).cpu().double() * draws.numel()
    assert bool((counts[expected == 0] == 0).all()), "drew a token outside the support"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    return stats.chisquare(obs[keep].numpy(),
                           (exp[keep] * obs[keep].sum() / exp[keep].sum()).numpy()).pvalue


def assert_drawn_from(draws, probs, min_support=5, alpha=1e-4):
    """``draws`` follow ``probs``: a support of more than ``min_support`` tokens, p > alpha."""
    assert int((probs > 0).sum()) > min_support
    p = pvalue(draws, probs)
    assert p > alpha, p
