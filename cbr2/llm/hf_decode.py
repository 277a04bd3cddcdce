"""The ``hf`` backend's decoding loop: greedy or sampled tokens from a causal LM's forward pass.

It is hand-written rather than ``model.generate``, for three things ``generate`` does not give
together:

- the KV cache of the part every prompt of a run shares (the system part: instructions and the
  KoPL function table) is computed once and copied into each prompt's generation;
- greedy decoding checks prompt-lookup drafts: the programs copy much of their text from the
  prompt's examples, so the continuation of a recurring n-gram is verified in one pass;
- outputs that do not depend on which prompts share a call (the predictions cache keys each
  prompt alone): every prompt is decoded on its own, with a prefix split that depends on the
  prompt text only, and sampling draws from a generator seeded by ``llm.seed`` and the prompt.

``Decoder`` holds one ``generate`` call's settings and the model's functions (forward pass, KV
caches) that ``cbr2.llm.hf.HFBackend`` hands it; ``Row`` is one prompt being decoded. ``torch``
and ``xgrammar`` are imported inside the methods.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cbr2.llm.base import cut_at_stop


def lookup_draft(seq: list[int], size: int, ngrams: tuple[int, ...] = (3, 2)) -> list[int]:
    """Up to ``size`` tokens that followed the latest earlier occurrence of ``seq``'s last n-gram.

    Longer n-grams are tried first (fewer false matches); an empty list when none recurs. A
    single-token match is not used: it is wrong too often to pay for a draft, since a pass over a
    few tokens costs about twice a one-token pass on CPU (measured with SmolLM2-135M).
    """
    for n in ngrams:
        if len(seq) <= n:
            continue
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == tail:
                return seq[start + n:start + n + size]
    return []


@dataclass
class Row:
    """One prompt being decoded."""

    index: int
    ids: list[int]
    prefix: tuple[int, ...] = ()
    generator: Any = None
    matcher: Any = None
    """xgrammar matcher of the row's output under ``generation.constrained`` (None: free decoding)."""
    out: list[int] = field(default_factory=list)
    text: str = ""

    @property
    def rest(self) -> list[int]:
        return self.ids[len(self.prefix):]


@dataclass
class Decoder:
    """Decodes groups of ``Row``s with a model's forward pass.

    Attributes:
        forward: ``forward(ids, cache, **kwargs)``: one pass that reads and extends ``cache`` in
            place and returns the logits.
        new_cache: An empty KV cache.
        shared_cache: The KV cache of a prefix, computed once while prompts keep sharing it
            (copied before it is extended).
        tokenizer: The model's tokenizer (decodes outputs, names the padding token).
        device: Where the tensors go.
        eos: End-of-sequence token ids.
        stop: Stop strings: a completion ends at the first (cut before it).
        max_new_tokens: Token cap per completion.
        temperature: 0 is greedy; else sampling with ``top_p`` from each row's generator.
        top_p: Nucleus mass when sampling.
        lookup: Longest prompt-lookup draft checked per pass in greedy, one-row decoding (0: none).
        full_attention: Whether every layer attends to all positions, so a cache can be cropped
            after a rejected draft (drafts are off otherwise).
        grammar: The compiled xgrammar grammar of ``generation.constrained`` (None: free decoding).
        vocab_size: The model's vocabulary size (sizes the grammar's token bitmask).
    """

    forward: Callable[..., Any]
    new_cache: Callable[[], Any]
    shared_cache: Callable[[tuple[int, ...]], Any]
    tokenizer: Any
    device: str
    eos: set[int]
    stop: list[str]
    max_new_tokens: int
    temperature: float
    top_p: float
    lookup: int
    full_attention: bool
    grammar: Any = None
    vocab_size: int = 0
    _bitmask: Any = field(default=None, init=False, repr=False)

    def new_matcher(self) -> Any:
        """A fresh grammar matcher for one output, or None without a grammar."""
        if self.grammar is None:
            return None
        import xgrammar as xgr

        if self._bitmask is None:
            self._bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        return xgr.GrammarMatcher(self.grammar)

    def _allowed(self, logits: Any, row: Row) -> Any:
        """``logits`` (one row, 1-D) with the tokens the row's grammar forbids set to -inf."""
        if row.matcher is None:
            return logits
        import xgrammar as xgr

        row.matcher.fill_next_token_bitmask(self._bitmask)
        masked = logits[None, :].float().clone()
        xgr.apply_token_bitmask_inplace(masked, self._bitmask.to(masked.device))
        return masked[0]

    def decode(self, rows: list[Row]) -> list[Row]:
        """Decode a group of prompts that share a prefix (or have none) together.

        Layout of the batch: ``[shared prefix | left padding | rest of the prompt]``; padding is
        masked out and positions continue from the prefix, so each row sees exactly its tokens.

        Returns:
            The rows, finished (``text`` and ``out`` set), in the order they finished.
        """
        import torch

        device = self.device
        prefix = rows[0].prefix
        n_prefix = len(prefix)
        if n_prefix:
            cache = copy.deepcopy(self.shared_cache(prefix))
            if len(rows) > 1:
                cache.batch_repeat_interleave(len(rows))
        else:
            cache = self.new_cache()
        width = max(len(r.rest) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos, default=0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), n_prefix + width), dtype=torch.long)
        mask[:, :n_prefix] = 1
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            rest = row.rest
            ids[b, width - len(rest):] = torch.tensor(rest)
            mask[b, n_prefix + width - len(rest):] = 1
            positions[b, width - len(rest):] = torch.arange(n_prefix, n_prefix + len(rest))
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        padded = bool((mask == 0).any())
        kwargs: dict[str, Any] = {"logits_to_keep": 1,
                                  "cache_position": torch.arange(n_prefix, n_prefix + width, device=device)}
        if padded:
            kwargs.update(attention_mask=mask, position_ids=positions)
        logits = self.forward(ids, cache, **kwargs)[:, -1, :]
        length = n_prefix + width
        if len(rows) == 1 and self.lookup > 0 and self.temperature <= 0 and self.full_attention:
            return [self._decode_lookup(rows[0], cache, logits, length)]
        next_pos = positions[:, -1] + 1
        active = list(rows)
        finished: list[Row] = []
        while active:
            tokens = self._pick(logits, active)
            keep = []
            for b, (row, token) in enumerate(zip(active, tokens, strict=True)):
                if self._take(row, token):
                    finished.append(row)
                else:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, next_pos = mask[index], next_pos[index]
                tokens = [tokens[b] for b in keep]
                active = [active[b] for b in keep]
            step = torch.tensor(tokens, device=device)[:, None]
            kwargs = {"logits_to_keep": 1, "cache_position": torch.tensor([length], device=device)}
            if padded:
                mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
                kwargs.update(attention_mask=mask, position_ids=next_pos[:, None])
            logits = self.forward(step, cache, **kwargs)[:, -1, :]
            next_pos = next_pos + 1
            length += 1
        return finished

    def _take(self, row: Row, token: int) -> bool:
        """Append ``token`` to ``row``'s completion; True (and ``row.text`` set) when it is finished."""
        row.out.append(token)
        if row.matcher is not None and not row.matcher.accept_token(token):
            # Cannot happen with the mask applied; fail loudly rather than emit an unchecked program.
            raise RuntimeError(f"token {token} was chosen outside the grammar")
        hit_eos = token in self.eos
        # Decoding the whole completion each step is cheap next to a forward pass, and a stop
        # string can straddle tokens.
        body = row.out[:-1] if hit_eos else row.out
        decoded = self.tokenizer.decode(body, skip_special_tokens=True)
        text = cut_at_stop(decoded, self.stop)
        stopped = len(text) < len(decoded)
        ended = row.matcher is not None and row.matcher.is_terminated()
        if hit_eos or stopped or ended or len(row.out) >= self.max_new_tokens:
            row.text = text
            return True
        return False

    def _decode_lookup(self, row: Row, cache: Any, logits: Any, length: int) -> Row:
        """Greedy decoding of one prompt with prompt-lookup drafts (same tokens, fewer passes).

        The programs copy much of their text from the prompt's examples (and, when a small
        model loops, from themselves). After each token, the continuation of the latest earlier
        occurrence of the last few tokens is proposed as a draft; one forward pass over the
        draft checks it, and the tokens that greedy decoding would have chosen anyway are kept,
        plus the first one it would have chosen differently. Measured on 2 CPU cores, a pass over
        eleven tokens costs ~2.3 one-token passes and keeps ~4 tokens, so decoding takes about
        half the time. Only the tokens are the same as one-at-a-time decoding, not every logit
        bit: greedy text would change only where two logits tie within float rounding.
        """
        import torch

        device = self.device
        token = int(self._allowed(logits[0], row).argmax())
        while not self._take(row, token):
            seq = row.ids + row.out
            # No draft beyond the token cap: the last pass then decides a single token.
            draft = lookup_draft(seq, min(self.lookup, self.max_new_tokens - len(row.out) - 1))
            step = [token, *draft]
            logits = self.forward(torch.tensor([step], device=device), cache, logits_to_keep=len(step),
                                  cache_position=torch.arange(length, length + len(step), device=device))
            # The greedy choice after step[:i + 1], for i = 0, 1, ... while it confirms the draft.
            # Under a grammar each choice is masked by the state after the tokens before it, so
            # draft tokens are taken (and fed to the matcher) one at a time as they are confirmed.
            accepted = 0
            best = int(self._allowed(logits[0, 0], row).argmax())
            while accepted < len(draft) and best == draft[accepted]:
                if self._take(row, draft[accepted]):
                    return row
                accepted += 1
                best = int(self._allowed(logits[0, accepted], row).argmax())
            # The cache holds the whole step; keep the positions of the accepted tokens only.
            if len(draft) > accepted:
                cache.crop(-(len(draft) - accepted))
            length += 1 + accepted
            token = best
        return row

    def _pick(self, logits: Any, rows: list[Row]) -> list[int]:
        """The next token of each row: argmax, or a draw from its own seeded generator."""
        import torch

        if self.grammar is not None:
            logits = torch.stack([self._allowed(logits[b], row) for b, row in enumerate(rows)])
        if self.temperature <= 0:
            return logits.argmax(dim=-1).tolist()
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        tokens = []
        for b, row in enumerate(rows):
            p = probs[b]
            if self.top_p < 1.0:
                sorted_p, order = torch.sort(p, descending=True)
                # Keep the smallest set of tokens whose mass reaches top_p (at least one).
                drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= self.top_p
                sorted_p = sorted_p.masked_fill(drop, 0.0)
                p = torch.zeros_like(p).scatter(0, order, sorted_p)
            tokens.append(int(torch.multinomial(p, 1, generator=row.generator).item()))
        return tokens
