"""Headless Chromium opens an executed notebook in JupyterLab and takes a screenshot (issue 9).

Where /usr/bin/chromium exists (else skipped): JupyterLab on a free localhost port with a token
serves a temp copy of the notebooks; 01 is executed there with nbclient (so it has outputs, the
chart images among them); Chromium loads /lab/tree/01-explore-trace.ipynb and writes a PNG, which
must be a real picture (size and colour variety), not a blank page. The PNG stays in the test's
tmp dir (printed) to look at.
"""
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from pathlib import Path

import nbformat
import pytest

from test_notebooks import NB_DIR, execute, parameterized

CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "kvcap-test-token"
NOTEBOOK = "01-explore-trace.ipynb"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer at {url}")


def png_stats(path: Path) -> tuple[int, int, float]:
    """Width, height and the share of non-zero bytes in the filtered image data of a PNG: a blank
    (one-colour) page filters to almost all zeros; text and charts do not."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    raw = zlib.decompress(idat)
    return w, h, 1.0 - raw.count(0) / len(raw)


def test_jupyterlab_renders_an_executed_notebook(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install -y chromium) — the browser check is skipped")
    root = tmp_path / "nb"
    root.mkdir()
    nb = execute(parameterized(NB_DIR / NOTEBOOK, {"db_path": str(tmp_path / "kvcap.duckdb")}), root)
    nbformat.write(nb, root / NOTEBOOK)
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = free_port()
    jupyter = str(Path(sys.executable).with_name("jupyter"))
    lab = subprocess.Popen(
        [jupyter, "lab", "--allow-root", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={tmp_path / 'lab-settings'}",
         f"--LabApp.workspaces_dir={tmp_path / 'lab-workspaces'}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "jupyterlab.log", "w"),
        cwd=root)
    shot = tmp_path / "01-explore-trace.png"
    try:
        wait_for(f"http://127.0.0.1:{port}/api/status?token={TOKEN}")
        profile = tmp_path / "chromium-profile"
        subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={profile}", f"--screenshot={shot}",
             "--window-size=1400,2000", "--virtual-time-budget=15000", "--hide-scrollbars",
             f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={TOKEN}"],
            capture_output=True, timeout=120, check=False)
    finally:
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.kill()
    assert shot.exists(), (tmp_path / "jupyterlab.log").read_text()[-2000:]
    w, h, busy = png_stats(shot)
    print(f"screenshot: {shot} ({w}x{h}, {shot.stat().st_size:,} bytes, {busy:.1%} busy)",
          file=sys.stderr)
    assert (w, h) == (1400, 2000)
    assert shot.stat().st_size > 40_000 and busy > 0.01, f"the page looks blank: {shot}"
