"""Conformance scenario `throughput` (run once by .ci/sdk-python, not by pytest):

1. the Rust SDK's figure: `kairosctl bench s2 --count N --workers 1 --slots 200 --kairos BIN --json`
   (its own fresh node);
2. the Python figure: a fresh `kairos dev`; N executions due at one instant T submitted with
   SubmitBatch of 1,000; one Python `Worker` (one Work stream, 200 credits, no-op handler)
   drains them; completions/s = handler starts / (last start - first start), as s2 counts it;
   then every execution is checked SUCCEEDED.

Prints both figures and the ratio (target >= 0.70; printed, not asserted) and the line
`conformance python dev throughput ok|FAILED <detail>`. Exit 1 when an execution is missing
or not SUCCEEDED.

Usage: python bench_throughput.py [--count 100000] [--kairos BIN] [--kairosctl BIN] [--skip-rust]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kairos  # noqa: E402
from kairos import api  # noqa: E402

from conftest import REPO, kairos_bin, start_dev  # noqa: E402

DEFINITION = """name: py-bench-noop
version: 1
retry: {max_attempts: 3, base_delay: 100ms, max_delay: 1s}
timeouts: {lease: 30s}
execution: {type: noop}
"""


def rust_figure(kairosctl: Path, kairos_path: Path, count: int) -> Optional[float]:
    cmd = [str(kairosctl), "bench", "s2", "--count", str(count), "--workers", "1", "--slots", "200",
           "--kairos", str(kairos_path), "--json"]
    print("rust:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(f"rust: kairosctl bench failed ({p.returncode}): {p.stderr[-2000:]}", flush=True)
        return None
    line = [l for l in p.stdout.strip().splitlines() if l.startswith("{")][-1]
    data: dict[str, Any] = json.loads(line)
    print(f"rust: {json.dumps(data)}", flush=True)
    return float(data["completions_per_s"])


async def python_figure(grpc: str, count: int, slots: int, profile: bool) -> tuple[float, int, int]:
    starts: list[float] = []
    async with kairos.Client(grpc, timeout=120) as c:
        await c.apply_definition(DEFINITION)
        w = kairos.Worker(c, "py-bench-noop", concurrency=slots, worker_id="py-bench")
        append = starts.append
        clock = time.time

        @w.handler("py-bench-noop")
        async def noop(task: kairos.Task) -> None:
            append(clock())

        run = asyncio.ensure_future(w.run())
        await asyncio.sleep(0.5)
        lead_ms = count // 20 + 2000
        t0 = int(time.time() * 1000)
        due = t0 + lead_ms
        batches = [
            [kairos.Submission("py-bench-noop", 1, {}, at=due, idempotency_key=f"b{i}-{j}") for j in range(i, min(i + 1000, count))]
            for i in range(0, count, 1000)
        ]
        sem = asyncio.Semaphore(4)
        ids: list[str] = []

        async def send(batch: list[kairos.Submission]) -> None:
            async with sem:
                for r in await c.submit_many(batch):
                    if isinstance(r, kairos.KairosError):
                        raise r
                    ids.append(r.execution_id)

        await asyncio.gather(*(send(b) for b in batches))
        cpu0 = time.process_time()
        submitted_s = time.time() * 1000 - t0
        print(f"python: submitted {len(ids)} in {submitted_s:.0f} ms (due at +{lead_ms} ms)", flush=True)
        deadline = time.monotonic() + 300
        while len(starts) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        cpu_s = time.process_time() - cpu0
        print(f"python: the worker's process used {cpu_s:.2f} CPU s draining", flush=True)
        await asyncio.sleep(0.5)
        w.stop()
        await asyncio.wait_for(run, 30)
        # Every one SUCCEEDED (the node's own counts for this namespace).
        stats = await c.stats(namespace="default")
        succeeded = int(stats.get("EXECUTION_STATUS_SUCCEEDED", 0))
    span = (max(starts) - min(starts)) if len(starts) > 1 else 0.0
    rate = len(starts) / span if span > 0 else 0.0
    return rate, len(starts), succeeded


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--slots", type=int, default=200)
    ap.add_argument("--kairos", type=Path, default=None)
    ap.add_argument("--kairosctl", type=Path, default=None)
    ap.add_argument("--skip-rust", action="store_true")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    kairos_path = a.kairos or kairos_bin()
    ctl = a.kairosctl or Path(os.environ.get("KAIROSCTL_BIN") or REPO / "target/release/kairosctl")
    rust = None if a.skip_rust else rust_figure(ctl, kairos_path, a.count)
    with tempfile.TemporaryDirectory() as d:
        os.environ["KAIROS_BIN"] = str(kairos_path)
        node = start_dev(Path(d))
        try:
            rate, started, succeeded = asyncio.run(python_figure(node.grpc, a.count, a.slots, a.profile))
        finally:
            node.proc.terminate()
            node.proc.wait(10)
    print(f"python: {started} started, {succeeded} SUCCEEDED; {rate:,.0f} completions/s", flush=True)
    ok = started >= a.count and succeeded == a.count
    ratio = f"{rate / rust:.2f}" if rust else "n/a"
    figures = f"python={rate:.0f}/s rust={rust:.0f}/s ratio={ratio}" if rust else f"python={rate:.0f}/s rust=n/a"
    print(f"throughput: {figures} (target ratio >= 0.70, printed, not asserted)", flush=True)
    detail = figures if ok else f"{figures}; {started} started, {succeeded} of {a.count} SUCCEEDED"
    print(f"conformance python dev throughput {'ok' if ok and (rust or a.skip_rust) else 'FAILED'} {detail}", flush=True)
    return 0 if ok and (rust or a.skip_rust) else 1


if __name__ == "__main__":
    sys.exit(main())
