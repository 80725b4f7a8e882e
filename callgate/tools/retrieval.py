"""Choosing the few tools a request most likely needs, among those its roles may use.

Every definition a model is shown costs tokens on every request, and a model choosing among
many similar tools (an MCP server brings dozens) picks worse. ``ToolIndex.rank`` orders a
catalog's tools for a request's text: BM25 (the ``bm25s`` package, the ``retrieval`` extra)
over each tool's name split into words (``get_weather``, ``getWeather`` and
``weather.get`` all give ``get weather``), its description, its argument names and
argument descriptions; optionally blended with the cosine similarity of an embedding
function the caller brings.

Only candidates are ranked: the caller passes the names the request's roles may use, and
the BM25 index is built over those tools alone (its word statistics too), so a tool the
roles may not use is never returned and never weighs on the others' scores. Equal scores
are ordered by name, so the same query always gives the same list.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.core.errors import ConfigurationError, InputError

# The user's embedding function: texts in, one vector per text out, in order.
Embed = Callable[[Sequence[str]], Sequence[Sequence[float]]]

INSTALL_HINT = "tool retrieval needs the bm25s package: pip install 'callgate[retrieval]'"
DEFAULT_EMBED_WEIGHT = 0.5
# What `callgate tools --top` and the API's `top` accept: retrieval is for showing a few
# tools; past this many, show the whole allowlist.
MAX_TOP = 100
DEFAULT_TOP = 5
# A name's words count this many times: a word in the name says more than one in a
# description (``get_weather`` is about weather; "weather" in a description may not be).
NAME_REPEAT = 2
# BM25 indexes kept per catalog, one per set of candidates (in practice, per role set).
MAX_INDEXES = 32
# Embedding functions whose tool vectors a catalog keeps: a caller passing a new function
# (a fresh lambda) on every request re-embeds the tools each time, but holds no more memory.
MAX_EMBEDDERS = 4

# Words that carry no meaning for choosing a tool. Short on purpose: BM25's inverse document
# frequency already weighs down words every tool has.
_STOPWORDS = """a an and are as at be by can could do does for from how i if in into is it its me
my of on or our please should so that the their then there these this those to was we were what
when where which who whose will with would you your"""
STOPWORDS = frozenset(_STOPWORDS.split())

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script; `_`, `.`, `-` split


def words(text: str) -> list[str]:
    """The words BM25 compares: camelCase and snake_case split, lower-cased, stopwords,
    bare numbers and single ASCII letters dropped, plurals folded (``cities`` → ``city``)."""
    out = []
    for raw in _WORD.findall(_CAMEL.sub(" ", text)):
        word = raw.lower()
        if word in STOPWORDS or word.isdigit() or (len(word) == 1 and word.isascii()):
            continue
        out.append(_singular(word))
    return out


def _singular(word: str) -> str:
    """A plural's singular, by the regular English rules only (no dictionary): enough to
    match ``emails`` with ``email`` and ``cities`` with ``city``."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _argument_texts(schema: Any) -> Iterator[str]:
    """Each argument's name, description and string choices, nested objects and array
    items included, from a JSON Schema (or BFCL's dialect of it)."""
    if not isinstance(schema, Mapping):
        return
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            yield str(name)
            yield from _argument_texts(sub)
    description = schema.get("description")
    if isinstance(description, str):
        yield description
    choices = schema.get("enum")
    if isinstance(choices, list):
        yield " ".join(c for c in choices if isinstance(c, str))
    yield from _argument_texts(schema.get("items"))


def tool_text(definition: Mapping[str, Any]) -> str:
    """One tool as a text: its name, description and arguments; what an embedding function
    is given, and what BM25 reads (with the name's words counted twice)."""
    name = str(definition.get("name", ""))
    parts = [name, str(definition.get("description", ""))]
    parts.extend(_argument_texts(definition.get("parameters")))
    return "\n".join(p for p in parts if p)


def tool_words(definition: Mapping[str, Any]) -> list[str]:
    return words(str(definition.get("name", ""))) * (NAME_REPEAT - 1) + words(tool_text(definition))


@dataclass(frozen=True)
class Scored:
    """A tool's place for one query: higher scores first, equal scores by name."""

    name: str
    score: float


class ToolIndex:
    """One catalog's tools, ready to rank. Catalogs are immutable values, so a catalog
    keeps one of these for its lifetime: the BM25 index of each candidate set and the
    vectors of each embedding function are computed once."""

    def __init__(self, definitions: Mapping[str, Mapping[str, Any]]) -> None:
        self._definitions = dict(definitions)
        self._words: dict[str, list[str]] = {}
        self._bm25: OrderedDict[frozenset[str], tuple[list[str], Any]] = OrderedDict()
        self._vectors: OrderedDict[Embed, dict[str, list[float]]] = OrderedDict()
        self._lock = threading.Lock()

    def rank(
        self,
        query: str,
        candidates: Iterable[str],
        top_k: int,
        *,
        embed: Embed | None = None,
        embed_weight: float = DEFAULT_EMBED_WEIGHT,
    ) -> list[Scored]:
        """The ``top_k`` best candidates for ``query``, best first.

        Without ``embed``, the BM25 score. With it, ``(1 - embed_weight) × BM25 / best
        BM25 + embed_weight × cosine(query, tool)``; ``embed_weight=1`` ranks by the
        embedding alone and needs no ``bm25s``. Tools that share no word with the query
        score 0 and come last, by name: the list is as long as ``top_k`` allows."""
        check_top_k(top_k)
        if not query.strip():
            raise InputError("the query is empty: give the request's text to choose tools for")
        if embed is not None and not 0.0 <= embed_weight <= 1.0:
            raise InputError(f"embed_weight must be between 0 and 1, not {embed_weight!r}")
        allowed = frozenset(candidates)
        unknown = allowed - self._definitions.keys()
        if unknown:
            raise InputError(f"no tools named {sorted(unknown)} in this catalog")
        names = sorted(allowed)
        if not names:
            return []
        weight = embed_weight if embed is not None else 0.0
        scores = [0.0] * len(names)
        if weight < 1.0:
            lexical = self._bm25_scores(query, allowed)
            best = max(lexical, default=0.0)
            scale = (1.0 - weight) / best if weight and best > 0 else 1.0
            scores = [s * scale for s in lexical]
        if embed is not None and weight > 0.0:
            similar = self._cosines(query, names, embed)
            scores = [s + weight * c for s, c in zip(scores, similar, strict=True)]
        ranked = sorted(zip(names, scores, strict=True), key=lambda p: (-p[1], p[0]))
        return [Scored(name, score) for name, score in ranked[:top_k]]

    def _tool_words(self, name: str) -> list[str]:
        found = self._words.get(name)
        if found is None:
            found = self._words[name] = tool_words(self._definitions[name])
        return found

    def _bm25_scores(self, query: str, allowed: frozenset[str]) -> list[float]:
        """BM25 scores of the allowed tools, in name order, from an index of those only."""
        names, retriever = self._bm25_index(allowed)
        ids = retriever.get_tokens_ids(words(query))
        if not ids:
            return [0.0] * len(names)
        return [float(s) for s in retriever.get_scores_from_ids(ids)]

    def _bm25_index(self, allowed: frozenset[str]) -> tuple[list[str], Any]:
        with self._lock:
            cached = self._bm25.get(allowed)
            if cached is not None:
                self._bm25.move_to_end(allowed)
                return cached
        bm25s = _bm25s()
        names = sorted(allowed)
        retriever = bm25s.BM25()
        # A tool whose text has no word at all stands as the empty word (bm25s needs one
        # token per document).
        retriever.index([self._tool_words(n) or [""] for n in names], show_progress=False)
        with self._lock:
            self._bm25[allowed] = (names, retriever)
            while len(self._bm25) > MAX_INDEXES:
                self._bm25.popitem(last=False)
        return names, retriever

    def _cosines(self, query: str, names: list[str], embed: Embed) -> list[float]:
        with self._lock:
            known = self._vectors.setdefault(embed, {})
            self._vectors.move_to_end(embed)
            while len(self._vectors) > MAX_EMBEDDERS:
                self._vectors.popitem(last=False)
            missing = [n for n in names if n not in known]
        texts = [tool_text(self._definitions[n]) for n in missing]
        vectors = _embedded(embed, [query, *texts])
        with self._lock:
            known.update(zip(missing, vectors[1:], strict=True))
        return [_cosine(vectors[0], known[n]) for n in names]


def check_top_k(top_k: int, most: int | None = None, *, name: str = "top_k") -> None:
    """A number of tools to return: a whole number, at least 1 (and at most ``most``)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"{name} must be a whole number of tools, at least 1, not {top_k!r}")
    if most is not None and top_k > most:
        raise InputError(
            f"{name} is at most {most}, not {top_k}: retrieval shows a few tools; "
            "to show every allowed tool, leave the query out"
        )


def _embedded(embed: Embed, texts: list[str]) -> list[list[float]]:
    vectors = [[float(x) for x in v] for v in embed(texts)]
    if len(vectors) != len(texts):
        raise ConfigurationError(
            f"the embed function returned {len(vectors)} vectors for {len(texts)} texts"
        )
    return vectors


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ConfigurationError(
            f"the embed function returned vectors of {len(a)} and {len(b)} dimensions"
        )
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norms if norms else 0.0


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError:
        raise ConfigurationError(INSTALL_HINT) from None
    return bm25s
