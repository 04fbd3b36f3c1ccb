"""The browser demo (cce_sdk_js/demo, built into one static HTML file) in headless Chromium.

The page runs the JavaScript lite engine; its topics are checked against the Python engine's
(`hash` embedder) on the same messages.
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cce_duck import Engine
from cce_duck.messages import parse_transcript
from tests.browser import chromium

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]


def _build(out: Path) -> Path:
    node = shutil.which("node")
    assert node, "node is needed to build the demo (.ci/run installs it)"
    subprocess.run([node, str(ROOT / "cce_sdk_js" / "scripts" / "build-demo.mjs"), "--out", str(out)],
                   check=True, capture_output=True, text=True)
    return out


def _python_topics(transcript: str) -> list[str]:
    msgs = parse_transcript(transcript)
    start = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
    for i, m in enumerate(msgs):
        m["timestamp"] = start + timedelta(minutes=i)
    with Engine(data_dir=None, embedder="hash") as eng:
        eng.ingest("pasted", msgs)
        return [f"Topic {i + 1}: {r['label']}\nmessages {r['start_turn'] + 1}–{r['end_turn'] + 1}"
                for i, r in enumerate(eng.notes("pasted").iter_rows(named=True))]


def test_demo_splits_topics_and_compares_context(tmp_path: Path) -> None:
    page = _build(tmp_path / "demo.html")
    html = page.read_text(encoding="utf-8")
    assert "<script src" not in html  # self-contained: nothing to fetch
    with chromium(tmp_path) as driver:
        driver.get(page.as_uri())
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        driver.find_element(By.ID, "sample").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#topics .topic"))
        transcript = driver.find_element(By.ID, "conversation").get_attribute("value") or ""
        shown = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#topics .topic")]
        expected = _python_topics(transcript)
        assert len(expected) >= 3
        assert [s.split(" · ")[0] for s in shown[: len(expected)]] == expected
        assert shown[-1].startswith("Recent messages (kept verbatim)")
        # the recent card lists the six hot messages themselves
        recent = driver.find_elements(By.CSS_SELECTOR, "#topics .topic ul.recent li")
        lines = [ln for ln in transcript.splitlines() if ln.strip()]
        assert len(recent) == 6
        assert recent[-1].text.split(": ", 1)[1] == lines[-1].split(": ", 1)[1]
        summary = driver.find_element(By.ID, "summary").text
        assert summary == f"40 messages → {len(expected)} topics + 6 recent"
        driver.find_element(By.ID, "ask-button").click()
        wait.until(lambda d: d.find_element(By.ID, "context").text)
        context = driver.find_element(By.ID, "context").text
        assert "-16 °C" in context
        sent = int(driver.find_element(By.ID, "context-tokens").text)
        full = int(driver.find_element(By.ID, "history-tokens").text)
        assert 0 < sent <= 400 < full
        savings = driver.find_element(By.ID, "savings").text
        assert savings.startswith(f"The model gets {sent} of {full} tokens")
        history = driver.find_element(By.ID, "history").text
        assert "Freezers are actually supposed to stay below -18 °C" in history
        shot = tmp_path / "demo.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 30_000
        Path("/tmp/cce_demo.png").write_bytes(shot.read_bytes())

        # a pasted conversation of its own; bad input shows an error, and no topics nor any
        # result of the conversation before (its context and savings included)
        box = driver.find_element(By.ID, "conversation")
        box.clear()
        box.send_keys("not a transcript")
        driver.find_element(By.ID, "split").click()
        wait.until(lambda d: d.find_element(By.ID, "error").text)
        assert "User:" in driver.find_element(By.ID, "error").text
        assert not driver.find_elements(By.CSS_SELECTOR, "#topics .topic")
        for stale in ("summary", "history", "context", "savings"):
            assert driver.find_element(By.ID, stale).text == "", stale
        assert driver.find_element(By.ID, "history-tokens").text == "0"
        own = "\n".join(
            f"{'User' if i % 2 == 0 else 'Assistant'}: {line}" for i, line in enumerate([
                "Let's plan the database migration to DuckDB.",
                "The migration needs a schema file and numbered migrations.",
                "Should the migration run in one transaction?",
                "Yes, each migration and its bookkeeping row commit together.",
                "Now the garden party on Saturday with a barbecue.",
                "The garden party starts at noon with a barbecue grill.",
                "Who brings the barbecue grill to the garden party?",
                "Marta brings the grill and the charcoal to the garden.",
                "And the piano lessons for the kids?",
                "Piano lessons are on Tuesday afternoons.",
                "How much do the piano lessons cost?",
                "Each piano lesson costs thirty dollars.",
            ]))
        box.clear()
        box.send_keys(own)
        driver.find_element(By.ID, "split").click()
        wait.until(lambda d: not d.find_element(By.ID, "error").text and
                   d.find_element(By.ID, "summary").text.startswith("12 messages"))
        shown = [t.text.split(" · ")[0] for t in driver.find_elements(By.CSS_SELECTOR, "#topics .topic")]
        assert shown[: len(_python_topics(own))] == _python_topics(own)
