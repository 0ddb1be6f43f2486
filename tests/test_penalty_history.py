"""presence / frequency_penalty count every generated token (positions >= the prompt), also
where the attention mask's left padding reaches past the returned prompt columns:
inputs_embeds, a passed cache with only the new ids, an encoder-decoder continuation whose
decoder mask spans the cache. (Only transformers' repetition penalty skips those columns.)"""
import copy

import torch

from gpu_sampler.hf import generate
from tests.models import tiny_model
from tests.test_seq2seq import V as S2S_V, _batch, tiny_seq2seq

FREQ, V = 1.0, 64
KW = dict(do_sample=False, frequency_penalty=FREQ, presence_penalty=0.5, return_dict_in_generate=True,
          output_scores=True, output_logits=True, eos_token_id=None, pad_token_id=0)


def _assert_counts_generated(out, vocab):
    L0 = out.sequences.shape[1] - len(out.scores)
    for t, (s, l) in enumerate(zip(out.scores, out.logits)):
        for b in range(s.shape[0]):
            c = torch.bincount(out.sequences[b, L0:L0 + t], minlength=vocab).float()
            torch.testing.assert_close(s[b], l[b] - FREQ * c - 0.5 * (c > 0).float(),
                                       msg=f"row {b} step {t}")


def test_decoder_only_embeds_and_new_ids_on_a_cache():
    model = tiny_model("llama", seed=0, vocab_size=V)
    ids, mask = torch.tensor([[0, 0, 0, 0, 0, 5], [7, 8, 9, 10, 11, 12]]), torch.tensor(
        [[0, 0, 0, 0, 0, 1], [1] * 6])
    _assert_counts_generated(generate(model, ids, attention_mask=mask, max_new_tokens=6, **KW), V)
    emb = model.get_input_embeddings()(ids)
    _assert_counts_generated(generate(model, inputs_embeds=emb, attention_mask=mask,
                                      max_new_tokens=6, **KW), V)
    first = generate(model, ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
                     return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    new = first.sequences[:, first.cache.get_seq_length():]
    m2 = torch.cat([mask, torch.ones(2, 2, dtype=torch.long)], 1)
    _assert_counts_generated(generate(model, new, attention_mask=m2, cache=first.cache,
                                      max_new_tokens=6, **KW), V)


def test_seq2seq_decoder_mask_spanning_the_cache():
    model = tiny_seq2seq("t5", seed=21, attn="eager")
    ids, mask = _batch(21)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                           eos_token_id=None, return_dict_in_generate=True)
    dec = torch.cat([torch.zeros(3, 1, dtype=torch.long), first.sequences[:, -1:]], 1)
    out = generate(model, ids, attention_mask=mask, cache=copy.deepcopy(first.cache),
                   decoder_input_ids=dec, decoder_attention_mask=torch.tensor([[0, 0, 0, 1, 1]] * 3),
                   max_new_tokens=5, **KW)
    _assert_counts_generated(out, S2S_V)
