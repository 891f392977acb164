"""A closed-loop HTTP load generator for requests that take seconds (the rerank scenario's):
``CONNECTIONS`` clients, each POSTing the next JSON body of a file (one per line, in turn)
as soon as its last answer came, for ``WARM_UP`` seconds then ``DURATION`` measured seconds;
then each finishes the request it has in flight (the server is left idle, with nothing
abandoned) and the script exits.

wrk doesn't suit these: at 16 requests of 32 pairs a MiniLM cross-encoder on one core answers
a request in seconds, so a separate warm-up run leaves a server seconds of abandoned work that
falls into the measured run, and a measured run that starts from an idle server ends with
seconds of work in flight that it doesn't count. Here warm-up and measurement are one run,
and every request counts for the share of its time that falls within the measured window.

It prints ``start`` and ``end`` when the window opens and closes (the caller reads CPU
counters then), and at the end one JSON line: ``requests`` (answered within the window),
``duration_s``, ``requests_per_s`` (their count over the window), ``shared_requests_per_s``
(each request counted for its share of time in the window: ``shared_count``), ``p50_ms``,
``p99_ms``,
``max_ms`` (of those), ``errors`` (non-200 answers and failures over the whole run),
``first_error``, ``total`` (every request) and ``drain_s`` (from the window's end to the last
answer).

Usage: python load.py URL BODIES CONNECTIONS WARM_UP DURATION [--timeout S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httpx


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of ``values``; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


def shared_count(records: list[tuple[float, float, bool]], opens: float,
                 closes: float) -> float:
    """Requests answered within the window, each counted for the share of its time (sent to
    answered) that falls inside it. For a closed loop this is the clients times the window
    over the mean latency (Little's law): it doesn't round to whole batches of answers at the
    window's edges, as a count of answers does when a server answers 16 requests at once."""
    total = 0.0
    for sent, answered, _ in records:
        if answered > sent:
            total += max(0.0, min(answered, closes) - max(sent, opens)) / (answered - sent)
    return total


async def drive(url: str, bodies: list[bytes], connections: int, warm_up_s: float,
                duration_s: float, timeout_s: float) -> dict[str, object]:
    """Long because: the clients, the window's marks and the summary share one loop."""
    records: list[tuple[float, float, bool]] = []  # (sent, answered, ok)
    errors: list[str] = []
    position = 0
    start = time.perf_counter()
    opens, closes = start + warm_up_s, start + warm_up_s + duration_s
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:

        async def one_client() -> None:
            nonlocal position
            while time.perf_counter() < closes:
                payload = bodies[position % len(bodies)]
                position += 1
                sent = time.perf_counter()
                try:
                    response = await client.post(url, content=payload, headers=headers)
                    ok = response.status_code == 200
                    if not ok:
                        errors.append(f"{response.status_code} {response.text[:200]}")
                except httpx.HTTPError as exc:
                    ok = False
                    errors.append(f"{type(exc).__name__}: {exc}")
                records.append((sent, time.perf_counter(), ok))

        async def marks() -> None:
            await asyncio.sleep(max(0.0, opens - time.perf_counter()))
            print("start", flush=True)
            await asyncio.sleep(max(0.0, closes - time.perf_counter()))
            print("end", flush=True)

        await asyncio.gather(marks(), *(one_client() for _ in range(connections)))
    inside = [(a - s) * 1000 for s, a, ok in records if ok and opens <= a < closes]
    return {
        "requests": len(inside), "duration_s": duration_s,
        "requests_per_s": len(inside) / duration_s,
        "shared_requests_per_s": shared_count(records, opens, closes) / duration_s,
        "p50_ms": percentile(inside, 0.50), "p99_ms": percentile(inside, 0.99),
        "max_ms": max(inside, default=float("nan")),
        "errors": len(errors), "first_error": errors[0] if errors else None,
        "total": len(records),
        "drain_s": max((a for _, a, _ in records), default=closes) - closes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("bodies")
    parser.add_argument("connections", type=int)
    parser.add_argument("warm_up", type=float)
    parser.add_argument("duration", type=float)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with open(args.bodies, "rb") as file:
        bodies = [line.strip() for line in file if line.strip()]
    if not bodies:
        print(f"no request bodies in {args.bodies}", file=sys.stderr)
        return 2
    summary = asyncio.run(drive(args.url, bodies, args.connections, args.warm_up,
                                args.duration, args.timeout))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
