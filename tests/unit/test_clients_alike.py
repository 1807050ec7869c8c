"""Client and AsyncClient have the same methods, declared once (pgembed/clientcore.py): the same
signatures and docstrings, the AsyncClient's coroutines, as help(), IDEs and inspect see them."""

from __future__ import annotations

import inspect

from pgembed import AsyncClient, Client


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_same_methods_signatures_and_docstrings() -> None:
    assert public(Client) - {"url"} == public(AsyncClient) - {"batcher"}
    for name in public(Client) - {"close"}:
        method, coroutine = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(method) == inspect.signature(coroutine), name
        assert method.__doc__ and method.__doc__ == coroutine.__doc__, name
        assert not inspect.iscoroutinefunction(method), name
        assert inspect.iscoroutinefunction(coroutine), name
    search = inspect.signature(Client("postgresql://nowhere/none").search)
    assert list(search.parameters) == ["model", "text", "k", "filter", "ef_search"]
    assert search.return_annotation == "list[Hit]"
