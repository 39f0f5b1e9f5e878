"""Suffix decoding (Oliaro et al. 2024, arXiv 2411.04975): drafts from suffix tries.

* ``SuffixTrie``: every substring (up to ``max_depth`` tokens) of the sequences added,
  with how often it occurred, and for each node its most frequent continuation.
  Substrings seen once stay implicit (read from the stored tokens), so adding a token
  costs a dict operation per *repeated* suffix; nothing is ever removed from a trie.
* ``SuffixMatcher``: the trie matches of the suffixes of a growing context (one per
  match length), kept up to date in at most ``max_depth`` steps per appended token.
* ``GlobalSuffixCache``: the outputs of earlier requests of one backend (one model,
  one tokenizer), bounded in tokens. Eviction is by generation: outputs go into a
  young trie; once it holds half the budget it becomes the old trie and the previous
  old trie is dropped whole, so the cache never holds more than ``max_tokens`` tokens
  and evicting costs nothing.
* ``SuffixDrafter``: the drafter. Per request it keeps a trie over the prompt and the
  generated tokens, matches the context in it and in the global tries, and proposes
  the most frequent continuation of the best match: for a match of m tokens at most
  ``min(k, max_spec_factor * m)`` tokens, walking while the estimated probability of
  the path (product of continuation frequencies) stays at or above
  ``min_token_prob``. Among match lengths and tries the draft with the highest score
  (the sum of its tokens' path probabilities, the expected accepted length) wins, as
  in Arctic Inference's ``SuffixDecodingCache``. Deterministic: its ``q`` is one-hot.

Why a trie of our own and not arctic-inference's C++ ``SuffixDecodingCache`` (issue 35;
measured 2026-12-06 on an Intel Xeon, 2 cores, docs/data/suffix-2026-12-06/): replaying
a recorded agent session (51 calls of the bench's agent sessions, 28,584 prompt tokens,
523 decoding steps) through both, the C++ tree is 3.4 times faster, but ours costs
151 us per step, prompts included, 1 % of a 15 ms decoding step (C++: 0.3 %), and
drafts as well (2.91 accepted tokens per step, C++ 2.85). Switching would save under
0.7 % of the time for a dependency PyPI ships only as source (its build needs torch,
nanobind, grpcio-tools, protobuf 5 and a C++ compiler, see .ci/setup-vllm.sh).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from speculative_llm.engine.drafters.base import Draft, DrafterBase
from speculative_llm.errors import ConfigError

if TYPE_CHECKING:
    from speculative_llm.config import SpecConfig
    from speculative_llm.engine.drafters.base import DrafterHost
    from speculative_llm.engine.loop.random_stream import RandomStream
    from speculative_llm.engine.loop.sampling import SamplingParams
    from speculative_llm.engine.request.grammar import GrammarConstraint

__all__ = [
    "DraftSource",
    "GlobalSuffixCache",
    "SuffixDrafter",
    "SuffixMatcher",
    "SuffixTrie",
    "build_suffix_drafter",
]

DraftSource = Literal["request", "global"]
"""Where a suffix draft came from: the request's own trie or the global one."""

_STRIDE = 1 << 32
"""Edge keys are ``node * _STRIDE + token``: one int key per edge is far smaller and
faster than a tuple or a dict per node (token ids are below 2**32)."""

_NONE = -1
_BOUNDARY = -1
"""Stored between sequences: no continuation crosses it."""


class SuffixTrie:
    """A depth-bounded suffix trie of token ids with occurrence counts, built lazily.

    Node 0 is the root (the empty string). A node stands for a substring of the added
    sequences of at most ``max_depth`` tokens; its count is how many times that
    substring occurs. Each node remembers its most frequent child (ties go to the
    most recent), so walking the likeliest continuation is one list read per token.

    Lazy leaves keep memory near one node per repeated substring instead of
    ``max_depth`` nodes per token: a node seen once has no children; its continuation
    is read from the stored tokens after its occurrence (``end``). When it is seen a
    second time, the first occurrence's next token becomes a child (``_split``), and so
    on down as the repetition goes on. Invariant: a node whose count is at least 2
    (and the root) has every child, with exact counts.

    Args:
        max_depth: Longest substring stored: it bounds the match length plus the draft
            length.

    Raises:
        ConfigError: ``max_depth < 2``.
    """

    __slots__ = (
        "_best",
        "_count",
        "_edges",
        "_end",
        "_open",
        "_store",
        "_token",
        "max_depth",
        "tokens",
    )

    def __init__(self, max_depth: int = 24) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 2:
            raise ConfigError(
                f"suffix_max_depth must be an integer >= 2, got {max_depth!r}.",
                field="suffix_max_depth",
            )
        self.max_depth = max_depth
        self.tokens = 0
        """Tokens added so far."""
        self._store: list[int] = []
        self._edges: dict[int, int] = {}
        self._count: list[int] = [0]
        self._best: list[int] = [_NONE]
        self._token: list[int] = [_NONE]
        self._end: list[int] = [_NONE]
        self._open: list[int] = [0]

    @property
    def nodes(self) -> int:
        """Nodes in the trie (the root included)."""
        return len(self._count)

    def start_sequence(self) -> None:
        """Begin a new sequence: later tokens do not continue the previous one."""
        if self._store and self._store[-1] != _BOUNDARY:
            self._store.append(_BOUNDARY)
        self._open = [0]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the current sequence, counting every new suffix."""
        edges, count, best, token_of, end = (
            self._edges,
            self._count,
            self._best,
            self._token,
            self._end,
        )
        store, depth = self._store, self.max_depth
        opened = self._open
        for token in tokens:
            position = len(store)
            store.append(token)
            extended = [0]
            for index, node in enumerate(opened):
                if index and count[node] < 2:
                    break  # seen once (here): every longer suffix is new too, left implicit
                key = node * _STRIDE + token
                child = edges.get(key)
                if child is None:
                    child = len(count)
                    edges[key] = child
                    count.append(1)
                    best.append(_NONE)
                    token_of.append(token)
                    end.append(position)
                elif end[child] != position:  # not counted for this position yet
                    count[child] += 1
                    if count[child] == 2:
                        self._split(child, index + 1)
                    end[child] = position
                leader = best[node]
                if leader != child and (leader == _NONE or count[child] >= count[leader]):
                    best[node] = child
                if len(extended) < depth:
                    extended.append(child)
            count[0] += 1
            opened = extended
        self._open = opened
        self.tokens += len(tokens)

    def _split(self, node: int, depth: int) -> None:
        """Give a node seen a second time the child its first occurrence implied."""
        after = self._end[node] + 1
        if depth >= self.max_depth or after >= len(self._store):
            return
        token = self._store[after]
        if token == _BOUNDARY:
            return
        child = len(self._count)
        self._edges[node * _STRIDE + token] = child
        self._count.append(1)
        self._best.append(_NONE)
        self._token.append(token)
        self._end.append(after)
        self._best[node] = child

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Add a whole sequence on its own (``start_sequence`` then ``extend``)."""
        self.start_sequence()
        self.extend(tokens)
        self.start_sequence()

    @property
    def open_nodes(self) -> list[int]:
        """Nodes of the current sequence's repeated suffixes: ``[i]`` has length i.

        The list stops at the first suffix seen only once (the last entry may be it):
        longer ones are new too and have no continuation yet.
        """
        return self._open

    def step(self, entry: int, token: int) -> int | None:
        """The match one token longer than ``entry`` (see ``SuffixMatcher``), or None."""
        if entry >= 0 and (entry == 0 or self._count[entry] >= 2):
            return self._edges.get(entry * _STRIDE + token)
        # A substring seen once: compare with the token after its occurrence.
        after = (self._end[entry] if entry >= 0 else -entry - 2) + 1
        if after < len(self._store) and self._store[after] == token:
            return -after - 2
        return None

    def occurrences(self, tokens: Sequence[int]) -> int:
        """How many times a substring of at most ``max_depth`` tokens occurs."""
        entry: int | None = 0
        for token in tokens:
            assert entry is not None
            entry = self.step(entry, token)
            if entry is None:
                return 0
        assert entry is not None
        return self._count[entry] if entry >= 0 else 1

    def walk(
        self, entry: int, depth: int, max_tokens: int, min_token_prob: float, *, pending: int = 0
    ) -> tuple[list[int], float]:
        """The most frequent continuation of a match: ``(tokens, score)``.

        Each token's probability is the product of the continuation frequencies on the
        way (``count(child) / count(parent)``); the walk stops below ``min_token_prob``
        and at ``max_depth``. The score is the sum of the tokens' probabilities.

        Args:
            entry: The match: a node, or a substring seen once (see ``SuffixMatcher``).
            depth: Its length.
            max_tokens: Most tokens to return.
            min_token_prob: Smallest path probability a token may have.
            pending: Occurrences of ``entry`` that have no continuation yet (the
                trailing occurrence in a request's own trie), left out of its count.
        """
        count, best, token_of, store = self._count, self._best, self._token, self._store
        limit = min(max_tokens, self.max_depth - depth)
        tokens: list[int] = []
        score, prob = 0.0, 1.0
        node = entry
        total = count[node] - pending if node >= 0 else 1 - pending
        while len(tokens) < limit and total > 0:
            if (node > 0 and count[node] < 2) or node < 0:
                # Seen once: the stored tokens after the occurrence, each as likely.
                after = (self._end[node] if node >= 0 else -node - 2) + 1
                while len(tokens) < limit and after < len(store) and store[after] != _BOUNDARY:
                    tokens.append(store[after])
                    score += prob
                    after += 1
                break
            child = best[node]
            if child == _NONE:
                break
            prob *= count[child] / total
            if prob < min_token_prob:
                break
            tokens.append(token_of[child])
            score += prob
            node, total = child, count[child]
        return tokens, score


class SuffixMatcher:
    """The matches of a trie for the suffixes of a context that grows.

    ``entries[i]`` matches the context's last i tokens: a node id, or, for a substring
    the trie holds once and so has no node, ``-(position + 2)`` with the position of
    its last token in the trie's store. The list stops at the first length that does
    not occur (a trie holds every substring of what it stores, so no longer suffix
    occurs either), and below ``max_depth`` (a match that long has no continuation).
    """

    __slots__ = ("entries", "trie")

    def __init__(self, trie: SuffixTrie) -> None:
        self.trie = trie
        self.entries: list[int] = [0]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the context."""
        trie = self.trie
        depth = trie.max_depth
        entries = self.entries
        for token in tokens:
            matched = [0]
            for entry in entries:
                longer = trie.step(entry, token)
                if longer is None:
                    break
                matched.append(longer)
                if len(matched) == depth:
                    break
            entries = matched
        self.entries = entries


def best_continuation(
    trie: SuffixTrie,
    entries: Sequence[int],
    k: int,
    max_spec_factor: float,
    min_token_prob: float,
    *,
    trailing: bool,
) -> tuple[list[int], float, int]:
    """The best draft over every match length: ``(tokens, score, match length)``.

    A match of m tokens may draft ``min(k, max_spec_factor * m, max_depth - m)``
    tokens. Longer matches are tried first and win ties; the search stops once the
    cap cannot beat the best score so far (a score never exceeds its length).

    Args:
        trie: The trie.
        entries: ``entries[m]`` matches the context's last m tokens.
        k: Most tokens to draft.
        max_spec_factor: Draft length per matched token.
        min_token_prob: Smallest path probability a drafted token may have.
        trailing: Whether the context itself is in the trie (a request's own trie):
            its trailing occurrence has no continuation and is left out of the counts.
    """
    best: tuple[list[int], float, int] = ([], 0.0, 0)
    pending = 1 if trailing else 0
    for length in range(len(entries) - 1, 0, -1):
        reach = min(k, int(length * max_spec_factor + 1e-6))
        if reach <= best[1]:
            break  # shorter matches reach no further
        if min(reach, trie.max_depth - length) <= best[1]:
            continue
        tokens, score = trie.walk(entries[length], length, reach, min_token_prob, pending=pending)
        if score > best[1]:
            best = (tokens, score, length)
    return best


class GlobalSuffixCache:
    """Outputs of earlier requests of one backend, bounded to ``max_tokens`` tokens.

    Outputs go into a young trie; when the next output would take it past half the
    budget, it becomes the old trie and the previous old trie is dropped whole
    (generational eviction: bounded memory, no per-token bookkeeping, no pause). An
    output longer than half the budget keeps its first half-budget tokens. The cache
    belongs to one model and tokenizer: token ids mean nothing elsewhere.

    Args:
        max_depth: Depth of the tries (see ``SuffixTrie``).
        max_tokens: Most tokens held; 0 keeps nothing (the global trie is off).

    Raises:
        ConfigError: A negative ``max_tokens`` or a ``max_depth`` below 2.
    """

    def __init__(self, max_depth: int = 24, max_tokens: int = 32768) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ConfigError(
                f"suffix_cache_tokens must be an integer >= 0, got {max_tokens!r}.",
                field="suffix_cache_tokens",
            )
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self._young = SuffixTrie(max_depth)
        self._old: SuffixTrie | None = None
        self.evictions = 0
        """Generations dropped so far."""
        self.outputs = 0
        """Outputs added so far."""

    @property
    def tokens(self) -> int:
        """Tokens held now (young and old generations)."""
        return self._young.tokens + (self._old.tokens if self._old is not None else 0)

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one request's output."""
        if self.max_tokens == 0 or not tokens:
            return
        half = max(self.max_tokens // 2, 1)
        kept = list(tokens[:half])
        if self._young.tokens + len(kept) > half:
            if self._old is not None:
                self.evictions += 1
            self._old, self._young = self._young, SuffixTrie(self.max_depth)
        self._young.add_sequence(kept)
        self.outputs += 1

    def tries(self) -> tuple[SuffixTrie, ...]:
        """The non-empty generations, youngest first."""
        held = (self._young, self._old)
        return tuple(trie for trie in held if trie is not None and trie.tokens)


class SuffixDrafter(DrafterBase):
    """Suffix decoding: drafts from the request's own trie and the backend's global one.

    On ``begin`` the prompt goes into a fresh per-request trie and the global tries
    are taken from ``cache`` (a snapshot: outputs added meanwhile serve later
    requests). Each proposal appends the tokens accepted since the last one, then
    takes the best draft among the per-request trie and the global ones (see the
    module docstring). ``finish`` adds the request's output to the global cache.

    Args:
        cache: The backend's global cache, or None for per-request tries only.
        max_depth: Depth of the per-request trie (the global cache has its own).
        max_spec_factor: Draft length allowed per matched token (alpha).
        min_token_prob: Smallest estimated probability a drafted token may have.

    Raises:
        ConfigError: A value out of range.
    """

    name = "suffix"
    cheap = True
    draft_sources: tuple[str, ...] = ("request", "global")

    def __init__(
        self,
        cache: GlobalSuffixCache | None = None,
        *,
        max_depth: int = 24,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> None:
        if not max_spec_factor > 0:
            raise ConfigError(
                f"suffix_max_spec_factor must be > 0, got {max_spec_factor!r}.",
                field="suffix_max_spec_factor",
            )
        if not 0.0 <= min_token_prob <= 1.0:
            raise ConfigError(
                f"suffix_min_token_prob must lie in [0, 1], got {min_token_prob!r}.",
                field="suffix_min_token_prob",
            )
        self.cache = cache
        self.max_depth = max_depth
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = float(min_token_prob)
        self._trie = SuffixTrie(max_depth)
        self._globals: list[SuffixMatcher] = []
        self._seen = 0
        self._last: int | None = None

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start a request: a new trie over the prompt, a snapshot of the global tries."""
        self._trie = SuffixTrie(self.max_depth)
        self._globals = [SuffixMatcher(trie) for trie in self.cache.tries()] if self.cache else []
        self._seen = 0
        self._last = None
        self._follow(prompt_tokens)

    def _follow(self, sequence: Sequence[int]) -> None:
        """Take in the tokens of ``sequence`` not seen yet."""
        seen = self._seen
        if seen > len(sequence) or (seen and sequence[seen - 1] != self._last):
            # Not a continuation of what was seen (the engine only ever appends, but a
            # caller may reuse the drafter): start over on this sequence.
            self.begin(sequence[:0])
            seen = 0
        fresh = sequence[seen:]
        if not fresh:
            return
        self._trie.extend(fresh)
        # The match in a global trie depends on the last max_depth tokens only.
        for matcher in self._globals:
            matcher.extend(fresh[-matcher.trie.max_depth :] if seen == 0 else fresh)
        self._seen = len(sequence)
        self._last = sequence[-1]

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: RandomStream | None,
        *,
        constraint: GrammarConstraint | None = None,
    ) -> Draft:
        """Propose the most frequent continuation of the best suffix match."""
        self._follow(sequence)
        if k < 1:
            return Draft([])
        factor, floor = self.max_spec_factor, self.min_token_prob
        tokens, score, length = best_continuation(
            self._trie, self._trie.open_nodes, k, factor, floor, trailing=True
        )
        source: DraftSource = "request"
        for matcher in self._globals:
            found = best_continuation(
                matcher.trie, matcher.entries, k, factor, floor, trailing=False
            )
            if found[1] > score:
                (tokens, score, length), source = found, "global"
        if not tokens:
            return Draft([])
        return Draft(tokens, match_length=length, source=source)

    def finish(self, output_tokens: Sequence[int]) -> None:
        """Add the request's output to the global cache (if there is one)."""
        if self.cache is not None:
            self.cache.add(output_tokens)


def build_suffix_drafter(spec: SpecConfig, host: DrafterHost) -> SuffixDrafter:
    """The ``suffix`` drafter of a request (``drafter_registry``'s factory).

    Its global trie (the backend's earlier outputs, per depth and size) is kept by the
    backend across requests, so it never mixes models or tokenizers;
    ``suffix_cache_tokens=0`` turns it off.
    """
    cache = None
    if spec.suffix_cache_tokens:
        depth, tokens = spec.suffix_max_depth, spec.suffix_cache_tokens
        cache = host.kept(("suffix", depth, tokens), lambda: GlobalSuffixCache(depth, tokens))
    return SuffixDrafter(
        cache,
        max_depth=spec.suffix_max_depth,
        max_spec_factor=spec.suffix_max_spec_factor,
        min_token_prob=spec.suffix_min_token_prob,
    )
