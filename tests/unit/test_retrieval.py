"""Catalog.select: the allowed tools that best match a request, best first.

Ranking is BM25 (bm25s) over each tool's name words, description and arguments; the
allowlist decides the candidates before anything is ranked, so a tool the roles may not use
is never returned, however well it matches. The missing ``bm25s`` package is one clear
``invalid_configuration`` error naming the extra to install.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pytest

from callgate import Registry, tool
from callgate.core.errors import ConfigurationError, ErrorCode, InputError
from callgate.tools import retrieval
from callgate.tools.registry import READ_ONLY, Catalog, ToolSpec


def spec(name: str, description: str, **arguments: str) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        arguments={
            "type": "object",
            "properties": {a: {"type": "string", "description": d} for a, d in arguments.items()},
        },
        kind="read",
        effect=READ_ONLY,
    )


TOOLS = [
    spec("get_weather", "Current weather for a city.", city="The city, e.g. Seoul"),
    spec("getStockPrice", "The latest price of a listed share.", ticker="Exchange symbol"),
    spec("refund_payment", "Refund part or all of an order's payment.", order_id="The order"),
    spec("delete_emails", "Delete every e-mail matching a search.", query="Mailbox search"),
    spec("read_email", "Read one e-mail by its id.", message_id="The message"),
    spec("convert", "Change an amount into another unit.", currency_code="ISO 4217 code"),
    spec("news.headlines", "Top news stories of the day.", topic="A subject"),
]
ALLOWLIST = {
    "support": [t.name for t in TOOLS],
    "viewer": ["get_weather", "getStockPrice", "read_email", "news.headlines", "convert"],
}


@pytest.fixture
def catalog() -> Catalog:
    return Catalog.of_specs(TOOLS, ALLOWLIST)


def names(tools: Sequence[Any]) -> list[str]:
    return [t.name for t in tools]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What's the weather like in Seoul today?", "get_weather"),
        ("stock price of Samsung", "getStockPrice"),  # camelCase split
        ("please refund order O-17", "refund_payment"),
        ("delete the 50 emails from the newsletter", "delete_emails"),  # plural folded
        ("convert 100 EUR, currency code USD", "convert"),  # an argument's name and words
        ("today's headlines", "news.headlines"),  # a dotted name
    ],
)
def test_the_clear_match_ranks_first(catalog: Catalog, query: str, expected: str) -> None:
    chosen = catalog.select(query, ["support"], 3)
    assert names(chosen)[0] == expected
    assert len(chosen) == 3


def test_a_forbidden_tool_is_never_returned_even_as_the_best_match(catalog: Catalog) -> None:
    # refund_payment is the only tool matching these words, and viewer may not use it.
    query = "refund the payment of order O-17"
    assert names(catalog.select(query, ["support"], 1)) == ["refund_payment"]
    for top_k in (1, 3, 5, 100):
        returned = names(catalog.select(query, ["viewer"], top_k))
        assert "refund_payment" not in returned
        assert "delete_emails" not in returned
        assert len(returned) == min(top_k, len(ALLOWLIST["viewer"]))
        assert set(returned) <= set(ALLOWLIST["viewer"])
    # Every query, every role set: the result is within the allowlist.
    for query in ("delete emails", "refund", "weather", "x"):
        for roles in (["viewer"], [], ["nobody"], ["viewer", "nobody"]):
            allowed = catalog.allowed_for(roles)
            assert set(names(catalog.select(query, roles, 100))) == allowed


def test_the_forbidden_tools_do_not_weigh_on_the_allowed_ones_scores(catalog: Catalog) -> None:
    """The index holds the candidates alone: the scores are those of a catalog made of the
    allowed tools only (the forbidden tools' words change no statistic)."""
    viewer_only = Catalog.of_specs(
        [t for t in TOOLS if t.name in ALLOWLIST["viewer"]], {"viewer": ALLOWLIST["viewer"]}
    )
    query = "read the weather e-mail"
    index = catalog._retrieval
    alone = viewer_only._retrieval
    assert index.rank(query, catalog.allowed_for(["viewer"]), 10) == alone.rank(
        query, ALLOWLIST["viewer"], 10
    )


def test_ties_are_ordered_by_name(catalog: Catalog) -> None:
    twins = Catalog.of_specs(
        [spec(n, "Look a word up in the dictionary.") for n in ("lookup_c", "lookup_a", "b")],
        {"r": ["lookup_c", "lookup_a", "b"]},
    )
    assert names(twins.select("dictionary", ["r"], 3)) == ["b", "lookup_a", "lookup_c"]
    # No word in common with any tool: every score is 0, and the order is by name.
    assert names(catalog.select("zzz qqq", ["viewer"], 5)) == sorted(ALLOWLIST["viewer"])
    # The same query twice, the same list.
    assert catalog.select("weather news", ["support"], 7) == catalog.select(
        "weather news", ["support"], 7
    )


def test_the_index_is_built_once_per_catalog_and_candidate_set(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    real = retrieval._bm25s()

    class Counting:
        @staticmethod
        def BM25() -> Any:
            built.append(1)
            return real.BM25()

    monkeypatch.setattr(retrieval, "_bm25s", lambda: Counting)
    for query in ("weather", "refund", "email", "weather"):
        catalog.select(query, ["support"], 3)
    assert len(built) == 1
    catalog.select("weather", ["viewer"], 3)  # another candidate set: another index
    assert len(built) == 2
    catalog.select("weather", ["viewer"], 1)
    assert len(built) == 2
    # Another allowlist is another catalog, with an index of its own.
    other = catalog.with_allowlist({"support": ["get_weather", "read_email"]})
    assert names(other.select("refund my order", ["support"], 5)) == ["get_weather", "read_email"]
    assert len(built) == 3


def test_a_registry_selects_its_tools() -> None:
    @tool
    def get_weather(city: str) -> dict[str, str]:
        """Current weather for a city."""
        return {"city": city}

    @tool
    def cancel_order(order_id: str) -> dict[str, str]:
        """Cancel an order that has not shipped."""
        return {"order_id": order_id}

    registry = Registry.of([get_weather, cancel_order], {"a": ["get_weather", "cancel_order"]})
    (first,) = registry.select("cancel my order", ["a"], 1)
    assert first is registry.tools["cancel_order"]


@pytest.mark.parametrize("top_k", [0, -1, True, 2.5])
def test_a_bad_top_k_is_invalid_input(catalog: Catalog, top_k: Any) -> None:
    with pytest.raises(InputError) as caught:
        catalog.select("weather", ["support"], top_k)
    assert caught.value.code == ErrorCode.INVALID_INPUT
    assert "top_k" in caught.value.message


def test_an_empty_query_is_invalid_input(catalog: Catalog) -> None:
    with pytest.raises(InputError, match="query is empty"):
        catalog.select("  \n", ["support"], 3)


def test_without_bm25s_select_says_which_extra_to_install(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bm25s", None)  # `import bm25s` now fails
    with pytest.raises(ConfigurationError) as caught:
        catalog.select("weather", ["support"], 3)
    error = caught.value
    assert error.code == ErrorCode.INVALID_CONFIGURATION
    assert "pip install 'callgate[retrieval]'" in error.message
    assert "\n" not in error.message


# A toy embedding: one dimension per concept, so synonyms no word matches land together.
CONCEPTS = [
    {"money", "euro", "eur", "dollar", "usd", "currency", "amount"},
    {"weather", "rain", "sunny", "umbrella"},
    {"mail", "email", "e", "message", "inbox"},
]


def toy_embed(calls: list[int]) -> retrieval.Embed:
    def embed(texts: Sequence[str]) -> list[list[float]]:
        calls.append(len(texts))
        out = []
        for text in texts:
            found = set(retrieval.words(text)) | set(text.lower().split())
            out.append([float(len(found & c)) for c in CONCEPTS] + [0.01])
        return out

    return embed


def test_an_embedding_finds_what_no_word_matches(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    query = "do I need an umbrella tomorrow"  # shares no word with get_weather
    assert names(catalog.select(query, ["support"], 1)) != ["get_weather"]
    calls: list[int] = []
    embed = toy_embed(calls)
    assert names(catalog.select(query, ["support"], 1, embed=embed)) == ["get_weather"]
    # Each tool's text was embedded once; later queries embed the query alone.
    assert calls == [1 + len(TOOLS)]
    catalog.select("how much is 100 euro in dollars", ["support"], 1, embed=embed)
    assert calls == [1 + len(TOOLS), 1]
    # The embedding ranks only allowed tools too.
    returned = names(catalog.select("refund money", ["viewer"], 100, embed=embed))
    assert set(returned) == set(ALLOWLIST["viewer"])
    # Ranked by the embedding alone, bm25s is not needed.
    monkeypatch.setitem(sys.modules, "bm25s", None)
    chosen = catalog.select("umbrella", ["support"], 1, embed=embed, embed_weight=1.0)
    assert names(chosen) == ["get_weather"]


def test_an_embed_function_that_miscounts_is_a_configuration_error(catalog: Catalog) -> None:
    with pytest.raises(ConfigurationError, match="2 vectors for 8 texts"):
        catalog.select("weather", ["support"], 1, embed=lambda texts: [[1.0], [0.0]])
    with pytest.raises(InputError, match="embed_weight"):
        catalog.select("weather", ["support"], 1, embed=toy_embed([]), embed_weight=1.5)


def test_words_split_names_and_fold_plurals() -> None:
    assert retrieval.words("getStockPrice") == ["get", "stock", "price"]
    assert retrieval.words("weather.get_by_city_date") == ["weather", "get", "city", "date"]
    assert retrieval.words("HTTPServer cities emails addresses") == [
        "http",
        "server",
        "city",
        "email",
        "address",
    ]
    assert retrieval.words("서울 날씨 in 2026") == ["서울", "날씨"]


def test_a_new_embed_function_per_request_holds_a_bounded_number_of_vector_sets(
    catalog: Catalog,
) -> None:
    first: list[int] = []
    embed = toy_embed(first)
    catalog.select("umbrella", ["support"], 1, embed=embed)
    for _ in range(retrieval.MAX_EMBEDDERS + 3):
        catalog.select("umbrella", ["support"], 1, embed=toy_embed([]))
    assert len(catalog._retrieval._vectors) == retrieval.MAX_EMBEDDERS
    # The first function's vectors were let go: its tools are embedded again.
    catalog.select("umbrella", ["support"], 1, embed=embed)
    assert first == [1 + len(TOOLS), 1 + len(TOOLS)]
