"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): load a
page at a window width, run the layout audit in it, read its console and take a screenshot.

No browser library: the protocol is JSON messages ended by a NUL byte on file descriptors 3 (to the
browser) and 4 (from it), as puppeteer's pipe transport speaks it. Tests use this through
``conftest.open_in_chromium``; ``bench/report_screenshots.py`` uses it to write the committed screenshots.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

AUDIT_JS = (Path(__file__).with_name("layout_audit.js")).read_text()


class ChromiumError(RuntimeError):
    pass


def binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """One headless Chromium with one page; a context manager that always ends the browser."""

    def __init__(self, profile: Path, timeout_s: float = 60.0):
        chromium = binary()
        if chromium is None:
            raise ChromiumError("chromium is not installed")
        self.timeout_s = timeout_s
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Above the numbers the child gets them at, so one dup2 cannot overwrite the other's source.
        high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)

        def as_3_and_4():
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Not close_fds: it would close 3 and 4 after they are made; the parent's own descriptors are
            # close-on-exec (Python's default), so only 0-4 reach the browser.
            close_fds=False,
            preexec_fn=as_3_and_4,
        )
        os.close(high_r)
        os.close(high_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime"):
            self.call(f"{domain}.enable", session=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            os.write(self._to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass

    def _message(self) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, left))
            if not ready:
                raise ChromiumError(f"no answer from chromium in {self.timeout_s:.0f} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ChromiumError(f"chromium ended (exit {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: bool = False, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._message()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise ChromiumError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            if "method" in answer:
                self.events.append(answer)

    def wait_for(self, method: str) -> dict:
        for i, event in enumerate(self.events):
            if event["method"] == method:
                return self.events.pop(i)
        while True:
            answer = self._message()
            if answer.get("method") == method:
                return answer
            if "method" in answer:
                self.events.append(answer)

    def open(self, url: str, width: int, height: int = 900) -> None:
        """Load URL in a window WIDTH px wide and wait for its load event."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise ChromiumError(f"the page's script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def audit(self) -> dict:
        """The layout audit (layout_audit.js) of the page as loaded: what is cut, piled or missing."""
        return self.evaluate(AUDIT_JS)

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def console(self) -> list[str]:
        """What the page wrote to its console and every uncaught exception, as lines."""
        self.evaluate("0")  # drains what arrived before
        lines = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                lines.append(f"console.{params.get('type')}: {text}")
            elif event["method"] == "Runtime.exceptionThrown":
                lines.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
        return lines

    def screenshot(self, path: Path) -> tuple[int, int]:
        """The whole page, as wide as the window, as a PNG at PATH; its (width, height) in px."""
        width, height = self.evaluate("[document.documentElement.clientWidth, document.documentElement.scrollHeight]")
        shot = self.call(
            "Page.captureScreenshot",
            session=True,
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return width, height
