"""``/docs`` and ``/redoc`` of a real ``cce serve rest`` in headless Chromium with every external
host blocked: the pages render from the assets the server ships (no CDN)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import chromium
from tests.servers import cce_server

CDN = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css"


@pytest.mark.browser
def test_docs_render_with_every_external_host_blocked(tmp_path: Path) -> None:
    with cce_server(["rest"], tmp_path / "data") as (base, _proc), \
            chromium(tmp_path, offline=True) as driver:
        spec = httpx.get(base + "/openapi.json").json()
        operations = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
        assert ("POST", "/v1/sessions/{session_id}/search") in operations
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)

        driver.get(base + "/docs")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= len(operations))
        shown = {(b.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
                  b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute(
                      "data-path")) for b in driver.find_elements(By.CSS_SELECTOR, ".opblock")}
        assert shown == operations
        loaded = driver.execute_script(
            "return performance.getEntriesByType('resource').map((e) => e.name);")
        assert loaded
        assert all(u.startswith(base) for u in loaded), loaded
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        # the browser really is cut off: the CDN Swagger UI uses by default cannot be reached
        outcome = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0]).then(() => done('loaded'), () => done('blocked'));", CDN)
        assert outcome == "blocked"

        driver.get(base + "/redoc")
        wait.until(lambda d: len(d.find_elements(
            By.CSS_SELECTOR, "[data-section-id^='tag/'][data-section-id*='/operation/']"))
            >= len(operations) - 1)  # /health has a tag of its own too
        assert "/v1/sessions/{session_id}/search" in driver.find_element(By.TAG_NAME, "body").text
