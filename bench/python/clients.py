"""The Kafka clients both Python jobs use, with watchbridge's settings: one place, so the two
jobs differ only in how they poll."""

from confluent_kafka import Consumer, Producer


def consumer(args):
    """The input consumer, subscribed to `args.input_topic`."""
    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            # Inputs written before the first start are watches too.
            "auto.offset.reset": "earliest",
            # watchbridge's input consumer's: a broker that holds every fetch for the whole
            # wait (Tansu 0.6 does) delays each batch of inputs by it, librdkafka's 500 ms
            # otherwise.
            "fetch.wait.max.ms": 20,
        }
    )
    c.subscribe([args.input_topic])
    return c


def producer(args):
    """The output producer. The same settings as watchbridge: no duplicates from retries,
    every replica acknowledges, small batches compressed."""
    return Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
