"""The operator console in a real browser (Debian's chromium, driven by Selenium) against a live
run: ``embodyrl train`` with two actors and a camera, dialling ``embodyrl console``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
selenium = pytest.importorskip("selenium")
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/setup installs them)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from embodyrl.console.process import ConsoleProcess  # noqa: E402

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1500")


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def text(driver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text.strip()


def number(driver, css: str) -> int | None:
    digits = text(driver, css).replace(",", "").replace(" ", "")
    return int(digits) if digits.isdigit() else None


@pytest.fixture
def live_run(tmp_path):
    run_dir = tmp_path / "run"
    with ConsoleProcess(run_dir) as console:
        train = subprocess.Popen(
            [sys.executable, "-m", "embodyrl.cli", "train", "pendulum_pixels", "--actors", "2", "--steps", "1000000",
             "--run-dir", str(run_dir), "--quiet", "--console", console.control,
             # the camera streams to the console; the networks read the state only (a quick compile)
             "--sac.encoder.image_fields", "[]", "--sac.encoder.ignore_fields", "[camera/front]",
             "--learner.replay_capacity", "20000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            yield console, run_dir, train
        finally:
            train.terminate()
            try:
                train.wait(timeout=60)
            except subprocess.TimeoutExpired:
                train.kill()


def test_the_console_in_a_browser(browser, live_run, tmp_path):
    console, run_dir, train = live_run
    browser.get(console.page)
    wait = WebDriverWait(browser, 400, poll_frequency=0.2)
    wait.until(lambda d: text(d, "#status").lower().startswith("live"))
    # two actors, their devices; the learner's numbers move
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".device")) == 2)
    first = wait.until(lambda d: number(d, "#learner-env-steps"))
    wait.until(lambda d: (number(d, "#learner-env-steps") or 0) > first)
    # a camera frame arrives
    wait.until(lambda d: any(img.get_attribute("data-seq") for img in d.find_elements(By.CSS_SELECTOR, "img.camera")))
    # an e-stop click latches the device; a clear releases it
    device = browser.find_element(By.CSS_SELECTOR, '.device[data-actor="0"][data-device="0"]')
    clicked = time.time()
    device.find_element(By.CSS_SELECTOR, "button.estop").click()
    wait.until(lambda d: text(d, '.device[data-actor="0"] .estop-state') == "E-STOPPED")
    seen = time.time()
    device.find_element(By.CSS_SELECTOR, "button.clear-estop").click()
    wait.until(lambda d: text(d, '.device[data-actor="0"] .estop-state') == "ok")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    estop = next(r for r in rows if r.get("event") == "action" and r["action"] == "estop")
    assert estop["status"] == "ok" and estop["origin"].startswith("browser")
    click_to_safe_ms = (estop["time"] - clicked) * 1000 + estop["applied_ms"]
    report = {"click_to_safe_action_ms": round(click_to_safe_ms, 1),
              "click_to_console_ms": round((estop["time"] - clicked) * 1000, 1),
              "console_to_safe_action_ms": estop["applied_ms"],
              "click_to_page_shows_estopped_ms": round((seen - clicked) * 1000, 1)}
    print(json.dumps(report))
    assert 0 < click_to_safe_ms < 2000
    # training paused and resumed from the page's bar: the learner answers and says so
    browser.find_element(By.ID, "pause-training").click()
    wait.until(lambda d: text(d, "#learner-training") == "paused")
    browser.find_element(By.ID, "resume-training").click()
    wait.until(lambda d: text(d, "#learner-training") == "running")
    assert train.poll() is None, train.stderr.read()
    shot = Path(os.environ.get("EMBODYRL_SCREENSHOT", tmp_path / "console.png"))
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    # the run stops short of its budget: the page says the learner is gone, and no control is left live
    train.terminate()
    train.wait(timeout=60)
    wait.until(lambda d: text(d, "#learner-training") == "gone")
    wait.until(lambda d: d.find_element(By.ID, "estop-all").get_property("disabled"))
    for button in ("button.estop", "button.clear-estop", "button.pause-toggle"):
        assert device.find_element(By.CSS_SELECTOR, button).get_property("disabled"), button
    assert all(browser.find_element(By.ID, b).get_property("disabled") for b in ("pause-training", "resume-training"))


def test_off_loopback_the_page_needs_the_token(browser, tmp_path):
    with ConsoleProcess(tmp_path, "--insecure", bind_host="0.0.0.0") as console:
        browser.get(console.url + "/")
        assert "not authorised" in browser.page_source
        browser.get(f"{console.url}/?token={console.token}")
        WebDriverWait(browser, 30).until(lambda d: text(d, "#status").lower().startswith("live"))
