"""The search page (GET / of `pgembed serve`) in a real headless Chromium, driven by selenium:
its layout at desktop and phone (390 px) widths, with screenshots; a slow search answered after
a newer one never replaces it; a loading state; the query in the URL and Back; "more like this";
the rows' other columns; "1 hit".

It needs Debian's `chromium` and `chromium-driver` (.ci/run installs them): without them the test
fails, it does not skip.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from helpers import search_on
from pgembed import db
from pgembed.catalog import registry
from pgembed.search import planner
from pgembed.serve.api import Api
from pgembed.serve.server import SearchServer

WAIT = 60  # seconds for anything the page does
SLOW_SECONDS = 4.0  # how late the slow search's answer comes


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("the browser test needs `apt-get install -y chromium chromium-driver`")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations, errors
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()


@pytest.fixture
def server(shop_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SearchServer]:
    """A server whose searches for a text starting with "slow" are answered SLOW_SECONDS late
    (an asyncio sleep in the test's own wrapper: other requests go on meanwhile)."""
    real = Api.search

    async def search(self: Api, payload: object) -> dict[str, Any]:
        if isinstance(payload, dict) and str(payload.get("text", "")).startswith("slow"):
            await asyncio.sleep(SLOW_SECONDS)
        return await real(self, payload)

    monkeypatch.setattr(Api, "search", search)
    api = Api(shop_url)
    api.warm()
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def keys_shown(browser: WebDriver, side: str = "left") -> list[str]:
    # Read in one script: element handles found first go stale when the page re-renders the list.
    texts = browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)",
        f"#{side} .key",
    )
    return [str(text).lstrip("#") for text in texts]


def search_for(browser: WebDriver, text: str, k: int | None = None) -> None:
    box = browser.find_element(By.NAME, "text")
    box.clear()
    box.send_keys(text)
    if k is not None:
        field = browser.find_element(By.NAME, "k")
        field.clear()
        field.send_keys(str(k))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def settled(browser: WebDriver) -> None:
    WebDriverWait(browser, WAIT).until(
        lambda b: (
            b.find_elements(By.CSS_SELECTOR, "#left .took")
            and not b.find_elements(By.CSS_SELECTOR, "section[aria-busy=true]")
        )
    )


def inside_viewport(browser: WebDriver, selector: str) -> bool:
    box = browser.execute_script(
        "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
        "return [r.left, r.right, innerWidth, document.documentElement.scrollWidth];",
        selector,
    )
    left, right, width, scroll_width = box
    return bool(left >= 0 and right <= width and scroll_width <= width)


def expected_keys(shop_url: str, text: str, k: int) -> list[str]:
    with db.connection(shop_url) as conn:
        hits = planner.query(conn, registry.get(conn, "minilm"), text, k)
    return [str(hit.key) for hit in hits]


def test_search_page_in_chromium(
    browser: WebDriver, server: SearchServer, shop_url: str, tmp_path: Path
) -> None:
    browser.get(server.url + "/")
    assert browser.title == "pgembed search"

    # desktop: the form on one screen, the Search button inside it
    assert inside_viewport(browser, "button[type=submit]")
    desktop = tmp_path / "desktop.png"
    assert browser.save_screenshot(str(desktop)) and desktop.stat().st_size > 1000

    # a slow search, then a newer one before it is answered: the newer one's hits stay
    search_for(browser, "slow battery question")
    WebDriverWait(browser, WAIT).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, "#left[aria-busy=true] .busy")
    )
    assert "searching" in browser.find_element(By.CSS_SELECTOR, "#left .busy").text
    search_for(browser, "crisp sweet apples", k=5)
    settled(browser)
    fast = expected_keys(shop_url, "crisp sweet apples", 5)
    assert keys_shown(browser) == fast
    time.sleep(SLOW_SECONDS + 1)  # the slow answer's time has come and gone
    assert keys_shown(browser) == fast
    assert browser.find_element(By.NAME, "text").get_attribute("value") == "crisp sweet apples"
    assert "text=crisp+sweet+apples" in browser.current_url

    # each hit shows its row's other columns, not the text or key again
    row = browser.find_element(By.CSS_SELECTOR, "#left li .row").text
    assert "rating:" in row and "product:" in row and "id:" not in row

    # "1 hit", not "1 hits"
    search_for(browser, "battery dies fast", k=1)
    WebDriverWait(browser, WAIT).until(
        lambda b: keys_shown(b) == expected_keys(shop_url, "battery dies fast", 1)
    )
    settled(browser)
    assert browser.find_element(By.CSS_SELECTOR, "#left .took").text.startswith("1 hit in ")

    # Back: the previous query and its hits
    browser.back()
    WebDriverWait(browser, WAIT).until(lambda b: keys_shown(b) == fast)
    assert browser.find_element(By.NAME, "text").get_attribute("value") == "crisp sweet apples"

    # more like this: the rows like the first hit, itself excluded
    first = fast[0]
    browser.find_element(By.CSS_SELECTOR, "#left li .more").click()
    WebDriverWait(browser, WAIT).until(lambda b: f"similar_to={first}" in b.current_url)
    settled(browser)
    with db.connection(shop_url) as conn:
        like = search_on(conn, registry.get(conn, "minilm"), similar_to=int(first), k=5)
    WebDriverWait(browser, WAIT).until(lambda b: keys_shown(b) == [str(h.key) for h in like])
    assert browser.find_element(By.ID, "like").text == f"rows like #{first}"

    # a shared URL opens on its search
    browser.get(server.url + "/?text=crisp+sweet+apples&model=minilm&k=5")
    WebDriverWait(browser, WAIT).until(lambda b: keys_shown(b) == fast)

    # a filter in the URL, its number sent with every digit typed (a double would round it and
    # match the other half of the rows)
    with db.connection(shop_url) as conn:
        conn.execute("ALTER TABLE reviews ADD COLUMN price numeric")
        conn.execute("UPDATE reviews SET price = 4.5 + (id % 2) * 1e-17")
        odd = planner.query(
            conn,
            registry.get(conn, "minilm"),
            "crisp sweet apples",
            5,
            {"price": Decimal("4.50000000000000001")},
        )
    assert odd and all(int(str(hit.key)) % 2 == 1 for hit in odd)
    query = urlencode({"text": "crisp sweet apples", "model": "minilm", "k": 5})
    browser.get(f"{server.url}/?{query}&filter=" + quote('{"price": 4.50000000000000001}'))
    WebDriverWait(browser, WAIT).until(lambda b: keys_shown(b) == [str(h.key) for h in odd])

    # a phone, 390 px wide: the form wraps, the Search button is on screen, nothing scrolls sideways
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True},
    )
    browser.get(server.url + "/?text=crisp+sweet+apples&model=minilm&k=5")
    WebDriverWait(browser, WAIT).until(lambda b: keys_shown(b) == fast)
    assert browser.execute_script("return innerWidth") == 390
    for selector in ("button[type=submit]", "select[name=model]", "input[name=text]", "#left"):
        assert inside_viewport(browser, selector), selector
    phone = tmp_path / "phone.png"
    assert browser.save_screenshot(str(phone)) and phone.stat().st_size > 1000
    logs = browser.get_log("browser")  # type: ignore[attr-defined]  # chromium's own
    assert not [entry for entry in logs if entry["level"] == "SEVERE"], logs
