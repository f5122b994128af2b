"""Time the main job: `kvcap report` on the built-in default scenario (target: <= 90 s on the
project's 2-core machine). Prints wall and CPU seconds and the number of distinct replays."""
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

kvcap = str(Path(sys.executable).with_name("kvcap"))
with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    res = subprocess.run([kvcap, "report", "-o", d, "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        sys.exit(res.stderr)
    out = json.loads(res.stdout)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print("| job | wall s | CPU s (all processes) | replays | requests |")
    print("|---|---:|---:|---:|---:|")
    print(f"| kvcap report (default scenario) | {wall:.1f} | {cpu.ru_utime + cpu.ru_stime:.1f} | "
          f"{out['runs']} | {out['baseline']['requests']:,} |")
