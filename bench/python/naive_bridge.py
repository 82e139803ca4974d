#!/usr/bin/env python3
"""The watchbridge job written the obvious way, in Python with confluent-kafka.

What a user would write in an afternoon instead of using watchbridge: for every
record on the input topic, poll a URL made from it, and produce every item not seen before
for that input to the output topic (key = the input's key, value = the item's JSON,
timestamp = the item's event time), until the response says `complete`. One thread, one
loop: consume new inputs, then poll every active watch's URL in turn. One request in
flight at a time: concurrent_bridge.py beside it is the same job with many (asyncio).

It is the comparison of benches/vs_python.rs (issue 8, case 5), run from the venv that
scripts/python-venv.sh makes from requirements.txt beside this file:

    python naive_bridge.py --bootstrap 127.0.0.1:9092 --input-topic users \
        --output-topic events --group naive --url 'http://127.0.0.1:8080/feeds/{id}' \
        --expect 100000

What it does not do, next to watchbridge: no durable state (a restart polls everything
again and emits duplicates), no retries with backoff, no per-host limits, no watermarks,
and offsets auto-committed whether or not the outputs were delivered.
"""

import argparse
import json
import signal
import sys
import time

import requests
from confluent_kafka import KafkaError

import clients


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--group", default="naive-bridge", help="consumer group of the input")
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
        "--expect",
        type=int,
        default=0,
        help="exit once this many outputs are delivered (0: run until SIGTERM/Ctrl-C)",
    )
    return p.parse_args()


def main():
    args = parse_args()

    consumer = clients.consumer(args)
    producer = clients.producer(args)
    # Keep-alive connections to the API.
    http = requests.Session()

    watches = {}  # input key -> URL, while the watch is active
    seen = {}  # input key -> ids of the items already produced
    next_poll = {}  # input key -> when to poll it next (time.monotonic())
    delivered = 0
    failed = 0

    def on_delivery(err, _msg):
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1
            print(f"delivery failed: {err}", file=sys.stderr)

    stopping = False

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def produce(key, value, timestamp):
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
                producer.poll(0.1)

    while not stopping and not (args.expect and delivered >= args.expect):
        # New inputs: take what is there, and only wait for more when nothing else to do.
        wait = 0 if watches else 0.1
        for msg in consumer.consume(num_messages=500, timeout=wait):
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    print(f"consume: {msg.error()}", file=sys.stderr)
                continue
            key = msg.key()
            if key in watches or key in seen:
                continue  # already watched (or finished): one watch per key
            try:
                url = args.url.format(**json.loads(msg.value()))
            except (ValueError, KeyError, TypeError) as e:
                print(f"input {key!r}: cannot build the URL: {e}", file=sys.stderr)
                continue
            watches[key] = url
            seen[key] = set()
            next_poll[key] = 0.0

        # Poll every active watch whose turn it is, one after the other.
        now = time.monotonic()
        for key, url in list(watches.items()):
            if next_poll[key] > now:
                continue
            next_poll[key] = now + args.poll_interval
            try:
                response = http.get(url, timeout=30)
                response.raise_for_status()
                body = response.json()
            except (requests.RequestException, ValueError) as e:
                print(f"poll {url}: {e}", file=sys.stderr)
                continue  # try again at the next turn
            ids = seen[key]
            for item in body.get(args.items, []):
                item_id = item[args.item_key]
                if item_id in ids:
                    continue
                ids.add(item_id)
                produce(key, json.dumps(item).encode(), int(item[args.item_time]))
            if body.get(args.complete):
                del watches[key], next_poll[key]  # keep `seen`: the key is not watched again
            # Serve delivery callbacks (and the producer's queue) as we go.
            producer.poll(0)
            if stopping:
                break
        producer.poll(0)

        # Nothing to poll yet: sleep until the next watch is due, but keep consuming.
        if watches and not stopping:
            due = min(next_poll.values()) - time.monotonic()
            if due > 0:
                time.sleep(min(due, 0.1))

    # Deliver what is still queued, then leave the group (commits the consumed offsets).
    remaining = producer.flush(30)
    consumer.close()
    print(
        f"naive_bridge: {delivered} outputs delivered, {failed} failed, "
        f"{remaining} undelivered, {len(watches)} watches still active",
        file=sys.stderr,
    )
    return 0 if failed == 0 and remaining == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
