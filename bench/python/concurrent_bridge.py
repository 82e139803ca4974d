#!/usr/bin/env python3
"""The watchbridge job written the way a competent Python engineer would: asyncio.

The same job as naive_bridge.py beside it (for every record on the input topic, poll a URL
made from it, and produce every item not seen before for that input to the output topic:
key = the input's key, value = the item's JSON, timestamp = the item's event time, until
the response says `complete`), but with many polls in flight at once, as watchbridge
keeps them: an asyncio task per watch, aiohttp on uvloop for HTTP, and a semaphore
bounding the polls in flight (`--max-in-flight`, watchbridge's default 256). A poll holds
its slot until its new outputs are handed to the producer, as watchbridge counts it. JSON
with orjson (`--json orjson`, the default when installed): the standard library's `json`
(`--json stdlib`) took about 5 µs of CPU per output item to parse and serialize, orjson
under 1.

Kafka stays confluent-kafka (librdkafka, the fastest client Python has): `produce` only
queues, so it is called from the event loop, and delivery reports are served with
`poll(0)` after every response; the blocking `consume` runs in a worker thread (it
releases the GIL while it waits). confluent-kafka's own asyncio wrappers (`aio`) are not
used: they add a future per message, more interpreter work per output for nothing here.

It is the comparison of benches/vs_python.rs (issue 50), run from the venv that
scripts/python-venv.sh makes from requirements.txt beside this file:

    python concurrent_bridge.py --bootstrap 127.0.0.1:9092 --input-topic users \
        --output-topic events --group concurrent --url 'http://127.0.0.1:8080/feeds/{id}'

What it does not do, next to watchbridge (as naive_bridge.py): no durable state (a
restart polls everything again and emits duplicates), no retries with backoff, no per-host
limits, no watermarks, and offsets auto-committed whether or not the outputs were
delivered.
"""

import argparse
import asyncio
import json
import signal
import sys

import aiohttp
from confluent_kafka import KafkaError

import clients

# Faster, and optional: the job runs without them too.
try:
    import uvloop
except ImportError:
    uvloop = None
try:
    import orjson
except ImportError:
    orjson = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--group", default="concurrent-bridge", help="consumer group of the input")
    p.add_argument(
        "--url",
        required=True,
        help="URL template; {field} is that field of the input's JSON value",
    )
    p.add_argument("--items", default="items", help="field of the response with the items")
    p.add_argument("--item-key", default="id", help="field of an item that identifies it")
    p.add_argument("--item-time", default="time", help="field of an item: epoch ms")
    p.add_argument("--complete", default="complete", help="field of the response: final?")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between two polls of the same watch",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="most polls in flight at once (watchbridge's WATCHBRIDGE_MAX_IN_FLIGHT default)",
    )
    p.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop" if uvloop else "asyncio",
        help="the event loop",
    )
    p.add_argument(
        "--json",
        choices=["orjson", "stdlib"],
        default="orjson" if orjson else "stdlib",
        help="the JSON library",
    )
    p.add_argument(
        "--expect",
        type=int,
        default=0,
        help="exit once this many outputs are delivered (0: run until SIGTERM/Ctrl-C)",
    )
    return p.parse_args()


async def bridge(args):
    loop = asyncio.get_running_loop()
    if args.json == "orjson":
        loads, dumps = orjson.loads, orjson.dumps
    else:
        # Compact, as orjson's and watchbridge's outputs.
        def dumps(value):
            return json.dumps(value, separators=(",", ":")).encode()

        loads = json.loads
    consumer = clients.consumer(args)
    producer = clients.producer(args)

    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)

    seen = {}  # input key -> ids of the items already produced (kept once done)
    tasks = set()  # the active watches
    counts = {"delivered": 0, "failed": 0}

    def on_delivery(err, _msg):
        if err is None:
            counts["delivered"] += 1
        else:
            counts["failed"] += 1
            print(f"delivery failed: {err}", file=sys.stderr)

    def serve_deliveries():
        producer.poll(0)
        if args.expect and counts["delivered"] >= args.expect:
            stopping.set()

    async def produce(key, value, timestamp):
        while True:
            try:
                producer.produce(
                    args.output_topic,
                    key=key,
                    value=value,
                    timestamp=timestamp,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                # The producer's queue is full: let it send (and call back) for a while.
                serve_deliveries()
                await asyncio.sleep(0.01)

    # Keep-alive connections to the API, as many as polls in flight (aiohttp's default is
    # 100 in all).
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=args.max_in_flight, limit_per_host=0)
    in_flight = asyncio.Semaphore(args.max_in_flight)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def watch(key, url):
            ids = seen[key]
            while True:
                async with in_flight:
                    try:
                        async with http.get(url) as response:
                            response.raise_for_status()
                            body = loads(await response.read())
                    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                        print(f"poll {url}: {e}", file=sys.stderr)
                        body = None  # try again at the next turn
                    if body is not None:
                        for item in body.get(args.items, []):
                            item_id = item[args.item_key]
                            if item_id in ids:
                                continue
                            ids.add(item_id)
                            await produce(key, dumps(item), int(item[args.item_time]))
                        serve_deliveries()
                        if body.get(args.complete):
                            return
                await asyncio.sleep(args.poll_interval)

        async def consume():
            # New inputs, from a worker thread: `consume` blocks while it waits.
            while not stopping.is_set():
                msgs = await loop.run_in_executor(None, consumer.consume, 500, 0.1)
                for msg in msgs:
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            print(f"consume: {msg.error()}", file=sys.stderr)
                        continue
                    key = msg.key()
                    if key in seen:
                        continue  # already watched (or finished): one watch per key
                    try:
                        url = args.url.format(**loads(msg.value()))
                    except (ValueError, KeyError, TypeError) as e:
                        print(f"input {key!r}: cannot build the URL: {e}", file=sys.stderr)
                        continue
                    seen[key] = set()
                    task = asyncio.create_task(watch(key, url))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                # Delivery reports while no poll comes back (all waiting, or none active).
                serve_deliveries()

        consuming = asyncio.create_task(consume())
        await stopping.wait()
        await consuming
        active = len(tasks)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # Deliver what is still queued, then leave the group (commits the consumed offsets).
    remaining = producer.flush(30)
    consumer.close()
    delivered, failed = counts["delivered"], counts["failed"]
    print(
        f"concurrent_bridge: {delivered} outputs delivered, {failed} failed, "
        f"{remaining} undelivered, {active} watches still active",
        file=sys.stderr,
    )
    return 0 if failed == 0 and remaining == 0 else 1


def main():
    args = parse_args()
    if args.loop == "uvloop":
        return uvloop.run(bridge(args))
    return asyncio.run(bridge(args))


if __name__ == "__main__":
    sys.exit(main())
