"""The live dashboard (``cce serve ui``) in headless Chromium: replay, ask, screenshot, assert.

Real server process, real browser (Debian chromium + chromium-driver through Selenium).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.browser import chromium
from tests.servers import cce_server

pytestmark = pytest.mark.browser


def _text(driver: object, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)  # type: ignore[attr-defined]


def test_dashboard_replays_and_shows_the_context(tmp_path: Path) -> None:
    with cce_server(["ui"], tmp_path / "data") as (base, _proc), chromium(tmp_path) as driver:
        # everything the page loads is served by this app (no CDN)
        for name in ("", "dashboard.js", "dashboard.css", "favicon.svg"):
            res = httpx.get(f"{base}/ui/{name}")
            assert res.status_code == 200
            assert "http" not in re.sub(r'"http://www.w3.org/2000/svg"', "", res.text), name
        driver.get(base + "/ui/?session=replay-1")
        wait = WebDriverWait(driver, 120, poll_frequency=0.2)
        wait.until(lambda d: _text(d, "status") == "ready")
        # a new session: nothing asked that does not exist (no 404 in the console), and an icon
        assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
        icon = driver.execute_script("return document.querySelector('link[rel=icon]').href")
        assert icon == base + "/ui/favicon.svg"
        assert httpx.get(icon).headers["content-type"].startswith("image/svg+xml")
        assert "favicon.ico" not in " ".join(driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"))
        Select(driver.find_element(By.ID, "delay")).select_by_value("0")
        driver.find_element(By.ID, "replay").click()
        wait.until(lambda d: _text(d, "status").startswith("replay done"))
        assert _text(driver, "status") == "replay done: 40 messages"
        # tiers filled as the engine says they are
        turns = httpx.get(base + "/v1/sessions/replay-1/turns").json()["turns"]
        notes = httpx.get(base + "/v1/sessions/replay-1/notes").json()["notes"]
        hot = [t for t in turns if t["state"] == "hot"]
        assert int(_text(driver, "count-hot")) == len(hot) == 6
        assert int(_text(driver, "count-warm")) == len(notes) >= 3
        assert int(_text(driver, "count-pending")) == sum(t["state"] == "pending" for t in turns)
        warm = _text(driver, "tier-warm")
        for n in notes:
            assert n["label"] in warm
            assert f"turns {n['start_turn']}–{n['end_turn']}" in warm
        assert hot[-1]["content"][:40] in _text(driver, "tier-hot")
        # the plot: one point per user message, sent below the full history at the end
        sent = driver.find_element(By.ID, "line-sent").get_attribute("points") or ""
        full = driver.find_element(By.ID, "line-full").get_attribute("points") or ""
        assert len(sent.split()) == len(full.split()) == 20
        caption = _text(driver, "plot-caption")
        m = re.search(r"After 39 messages: (\d+) tokens sent instead of (\d+)", caption)
        assert m is not None, caption
        assert int(m.group(1)) < int(m.group(2))
        # ask a question: context next to the full history, token counts, explain scores
        q = driver.find_element(By.ID, "question")
        q.clear()
        q.send_keys("What freezer alert threshold did we settle on?")
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: _text(d, "status").startswith("context:"))
        context = _text(driver, "context")
        assert "-16 °C" in context
        assert context.startswith("[system]\nMemory of earlier conversation")
        sent_tokens, full_tokens = int(_text(driver, "context-tokens")), int(_text(driver, "history-tokens"))
        assert 0 < sent_tokens <= 500 < full_tokens
        api = httpx.post(base + "/v1/sessions/replay-1/context",
                         json={"query": "What freezer alert threshold did we settle on?", "max_tokens": 500})
        assert api.json()["tokens"] == sent_tokens
        assert "Freezers are actually supposed to stay below -18 °C" in _text(driver, "history")
        # the explain form: budget split, chosen notes with their best scores, every hit in or out
        explained = httpx.post(base + "/v1/sessions/replay-1/context", json={
            "query": "What freezer alert threshold did we settle on?", "max_tokens": 500,
            "explain": True}).json()["explain"]
        b = explained["budget"]
        assert _text(driver, "budget") == (
            f"budget {sent_tokens} / 500 · pins {b['pins']} · system note {b['system_note']} · recent "
            f"{b['recent']} · pending {b['pending']} · notes {b['notes']} · overhead {b['overhead']} · "
            f"free {b['free']}")
        note_rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                     for tr in driver.find_elements(By.CSS_SELECTOR, "#chosen tbody tr")]
        assert note_rows == [[c["label"], f"{c['start_turn']}–{c['end_turn']}", str(len(c["quotes"])),
                              f"{c['dense']:.3f}", f"{c['bm25']:.2f}", f"{c['recency']:.2f}",
                              f"{c['fused']:.4f}"] for c in explained["chosen"]]
        assert len(note_rows) >= 1
        rows = driver.find_elements(By.CSS_SELECTOR, "#explain tbody tr")
        assert len(rows) == min(25, len(explained["hits"])) == 25
        quoted = {q["turn_no"] for c in explained["chosen"] for q in c["quotes"]}
        reasons = {d["turn_no"]: d["reason"] for d in explained["dropped"] if "turn_no" in d}
        marks = []
        for tr, hit in zip(rows, explained["hits"], strict=False):
            cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            assert cells[:2] == [str(hit["rank"]), str(hit["turn_no"])]
            if hit["turn_no"] in quoted:
                assert (cells[-1], tr.get_attribute("class")) == ("quoted", "chosen")
            elif hit["turn_no"] in explained["verbatim_turns"]:
                assert cells[-1] == "verbatim"
            else:
                assert cells[-1] == f"✗ {reasons[hit['turn_no']]}"
            marks.append(cells[-1])
        assert "quoted" in marks
        assert any(m.startswith("✗ ") for m in marks)
        # nothing was fetched from anywhere but this server
        loaded = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded
        assert all(u.startswith(base + "/") for u in loaded), loaded
        # type a message of your own
        driver.find_element(By.ID, "message").send_keys("Also: the loading dock door sensor is D-7.")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: "stored turn 40" in _text(d, "status"))
        assert "loading dock door sensor is D-7" in _text(driver, "tier-hot")
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 50_000
        Path("/tmp/cce_dashboard.png").write_bytes(shot.read_bytes())
        # closing the session fills the cold tier with the session's summary
        assert _text(driver, "count-cold") == "0"
        driver.find_element(By.ID, "close-session").click()
        wait.until(lambda d: _text(d, "status") == "session closed")
        summary = httpx.get(base + "/v1/sessions/replay-1/summary").json()["summary"]
        assert summary
        assert _text(driver, "count-cold") == "1"
        assert _text(driver, "tier-cold") == summary.strip()
        assert _text(driver, "count-hot") == _text(driver, "count-pending") == "0"


def test_dashboard_writes_need_the_key(tmp_path: Path) -> None:
    env = {"CCE_API_KEY": "s3cret"}
    with cce_server(["ui"], tmp_path / "data", env=env) as (base, _proc), chromium(tmp_path) as driver:
        assert httpx.get(base + "/ui/dashboard.js").status_code == 200  # the page itself is public
        driver.get(base + "/ui/?session=locked&delay=0")
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        wait.until(lambda d: _text(d, "status").startswith("401"))
        driver.find_element(By.ID, "message").send_keys("Stored once the key is given.")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: "401" in _text(d, "status") and "stored" not in _text(d, "status"))
        admin = {"Authorization": "Bearer s3cret"}
        assert httpx.get(base + "/v1/sessions/locked/turns", headers=admin).status_code == 404
        key = driver.find_element(By.ID, "apikey")
        key.send_keys("s3cret")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: "stored turn 0" in _text(d, "status"))
        turns = httpx.get(base + "/v1/sessions/locked/turns", headers=admin).json()["turns"]
        assert [t["content"] for t in turns] == ["Stored once the key is given."]
