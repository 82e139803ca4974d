/*
 * The watchbridge job written with the plain Kafka Java client, the peer of
 * benches/vs_java.rs: what a competent Java developer would write in an afternoon instead of
 * using watchbridge (or a Kafka Connect HTTP source connector per URL).
 *
 * For every record on the input topic, poll a URL made from it and produce every item not
 * seen before for that input to the output topic (key = the input's key, value = the item's
 * JSON, timestamp = the item's event time), until the response says `complete`; then the
 * watch ends. One consumer thread; the polls run on a pool of --threads threads (blocking
 * java.net.http requests, keep-alive connections); one KafkaProducer with watchbridge's
 * settings (idempotent, acks=all, lz4, linger.ms=5).
 *
 * After a crash: the seen ids are only in memory. The input offsets are committed by hand,
 * every second, after a producer flush, up to (not including) the oldest input whose watch
 * has not ended. So a restart starts every unfinished watch again from nothing and emits its
 * items again: at least once, duplicates but no losses. No retries with backoff, no
 * per-host limits, no watermarks, no rebalance handling (one instance).
 *
 *   java -cp "<kafka-clients and jackson jars>:<this, compiled>" NaiveBridge \
 *       --bootstrap 127.0.0.1:9092 --group naive --input-topic users --output-topic events \
 *       --url 'http://127.0.0.1:8080/feeds/{id}'
 *
 * Optional: --threads (default 32), --poll-interval seconds (default 1), --session-timeout-ms
 * (the consumer's, default the client's 45 s), --items, --item-key, --item-time, --complete
 * (the response's field names).
 *
 * Runs until SIGTERM (then stops polling, delivers what is queued, commits and leaves the
 * group). scripts/java-peer.sh compiles it.
 */

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class NaiveBridge {
    static final ObjectMapper JSON = new ObjectMapper();
    static final Pattern FIELD = Pattern.compile("\\{(\\w+)\\}");

    final Map<String, String> args;
    final HttpClient http;
    final KafkaProducer<String, String> producer;
    final ScheduledExecutorService pool;
    final Duration interval;
    /** Input keys ever watched (active or ended): one watch per key. */
    final Set<String> known = ConcurrentHashMap.newKeySet();
    /** Per input partition, the offsets of the inputs whose watch has not ended. */
    final Map<TopicPartition, ConcurrentSkipListSet<Long>> active = new ConcurrentHashMap<>();
    /** Per input partition, the offset after the last input consumed. */
    final Map<TopicPartition, Long> consumed = new HashMap<>();
    final AtomicLong delivered = new AtomicLong();
    final AtomicLong failed = new AtomicLong();
    volatile boolean stopping;

    NaiveBridge(Map<String, String> args) {
        this.args = args;
        this.interval = Duration.ofMillis((long) (Double.parseDouble(args.get("poll-interval")) * 1000));
        this.http = HttpClient.newBuilder()
                .version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(10))
                .build();
        Properties p = new Properties();
        p.put("bootstrap.servers", args.get("bootstrap"));
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.put("compression.type", "lz4");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        this.producer = new KafkaProducer<>(p);
        this.pool = Executors.newScheduledThreadPool(Integer.parseInt(args.get("threads")));
    }

    /** One poll of one watch; schedules the next one unless the watch ended. */
    void poll(String key, String url, TopicPartition tp, long offset, Set<String> seen) {
        if (stopping) {
            return;
        }
        try {
            HttpResponse<byte[]> response = http.send(
                    HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(30)).build(),
                    HttpResponse.BodyHandlers.ofByteArray());
            if (response.statusCode() / 100 != 2) {
                throw new RuntimeException("HTTP " + response.statusCode());
            }
            JsonNode body = JSON.readTree(response.body());
            for (JsonNode item : body.path(args.get("items"))) {
                String id = item.path(args.get("item-key")).asText();
                if (!seen.add(id)) {
                    continue;
                }
                long time = item.path(args.get("item-time")).asLong();
                producer.send(
                        new ProducerRecord<>(args.get("output-topic"), null, time, key, item.toString()),
                        (meta, e) -> {
                            if (e == null) {
                                delivered.incrementAndGet();
                            } else {
                                failed.incrementAndGet();
                                System.err.println("delivery failed: " + e);
                            }
                        });
            }
            if (body.path(args.get("complete")).asBoolean(false)) {
                active.get(tp).remove(offset);
                return;
            }
        } catch (Exception e) {
            System.err.println("poll " + url + ": " + e);
        }
        try {
            pool.schedule(() -> poll(key, url, tp, offset, seen), interval.toMillis(), TimeUnit.MILLISECONDS);
        } catch (RejectedExecutionException e) {
            // stopping
        }
    }

    /** The URL template with each `{field}` replaced by that field of the input's JSON. */
    String url(String value) throws Exception {
        JsonNode input = JSON.readTree(value);
        Matcher m = FIELD.matcher(args.get("url"));
        StringBuilder out = new StringBuilder();
        while (m.find()) {
            JsonNode field = input.get(m.group(1));
            if (field == null) {
                throw new IllegalArgumentException("no field " + m.group(1));
            }
            m.appendReplacement(out, Matcher.quoteReplacement(field.asText()));
        }
        m.appendTail(out);
        return out.toString();
    }

    /** Delivers what was produced, then commits each partition up to its oldest active input. */
    void commit(KafkaConsumer<String, String> consumer) {
        producer.flush();
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (Map.Entry<TopicPartition, Long> e : consumed.entrySet()) {
            ConcurrentSkipListSet<Long> open = active.get(e.getKey());
            Long oldest = open == null || open.isEmpty() ? null : open.first();
            offsets.put(e.getKey(), new OffsetAndMetadata(oldest == null ? e.getValue() : oldest));
        }
        if (!offsets.isEmpty()) {
            consumer.commitSync(offsets);
        }
    }

    void run() throws Exception {
        Properties c = new Properties();
        c.put("bootstrap.servers", args.get("bootstrap"));
        c.put("group.id", args.get("group"));
        // Inputs written before the first start are watches too.
        c.put("auto.offset.reset", "earliest");
        c.put("enable.auto.commit", "false");
        if (args.containsKey("session-timeout-ms")) {
            c.put("session.timeout.ms", args.get("session-timeout-ms"));
        }
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(java.util.List.of(args.get("input-topic")));
            long nextCommit = System.nanoTime() + 1_000_000_000L;
            while (!stopping) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(100))) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    consumed.put(tp, r.offset() + 1);
                    if (r.key() == null || !known.add(r.key())) {
                        continue; // one watch per key
                    }
                    String url;
                    try {
                        url = url(r.value());
                    } catch (Exception e) {
                        System.err.println("input " + r.key() + ": cannot build the URL: " + e);
                        continue;
                    }
                    active.computeIfAbsent(tp, t -> new ConcurrentSkipListSet<>()).add(r.offset());
                    Set<String> seen = ConcurrentHashMap.newKeySet();
                    long offset = r.offset();
                    pool.execute(() -> poll(r.key(), url, tp, offset, seen));
                }
                if (System.nanoTime() > nextCommit) {
                    commit(consumer);
                    nextCommit = System.nanoTime() + 1_000_000_000L;
                }
            }
            // Polls in progress finish; polls not yet due are dropped.
            pool.shutdownNow();
            pool.awaitTermination(30, TimeUnit.SECONDS);
            commit(consumer);
        }
        producer.close(Duration.ofSeconds(30));
        int open = active.values().stream().mapToInt(Set::size).sum();
        System.err.printf("naive bridge (Java): %d outputs delivered, %d failed, %d watches still active%n",
                delivered.get(), failed.get(), open);
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>(Map.of(
                "group", "naive-bridge",
                "items", "items",
                "item-key", "id",
                "item-time", "time",
                "complete", "complete",
                "poll-interval", "1",
                "threads", "32"));
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value, got " + argv[i]);
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        for (String required : new String[] {"bootstrap", "input-topic", "output-topic", "url"}) {
            if (!args.containsKey(required)) {
                System.err.println("--" + required + " is required");
                System.exit(2);
            }
        }
        NaiveBridge bridge = new NaiveBridge(args);
        Thread main = Thread.currentThread();
        // SIGTERM / Ctrl-C: stop polling, deliver, commit, leave the group.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            bridge.stopping = true;
            try {
                main.join(60_000);
            } catch (InterruptedException ignored) {
                // exiting anyway
            }
        }));
        bridge.run();
    }
}
