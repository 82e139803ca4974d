/*
 * The watchbridge job written with the plain Kafka Java client, the peer of
 * benches/vs_java.rs: what a competent Java developer would write in an afternoon instead of
 * using watchbridge (or a Kafka Connect HTTP source connector per URL).
 *
 * For every record on the input topic, poll a URL made from it and produce every item not
 * seen before for that input to the output topic (key = the input's key, value = the item's
 * JSON, timestamp = the item's event time), until the response says `complete`; then the
 * watch ends. One consumer thread; the polls run on a pool of --threads threads (blocking
 * java.net.http requests, keep-alive connections); one KafkaProducer with the settings of
 * watchbridge's librdkafka producers: idempotent, acks=all, lz4 (the Java client's default
 * lz4 level is its fast compressor, as librdkafka's), linger.ms=5, and batch.size=1000000
 * (librdkafka's default batch size; the Java client's own default is 16 KB).
 *
 * Two guarantees (--guarantee):
 *
 * at_least_once (the default): the seen ids are only in memory. The input offsets are
 * committed by hand every second (watchbridge's auto.commit.interval.ms in that mode), after
 * a producer flush, up to (not including) the oldest input whose watch has not ended. So a
 * restart starts every unfinished watch again from nothing and emits its items again:
 * duplicates but no losses.
 *
 * exactly_once: consume-transform-produce with transactions (transactional.id, read_committed
 * input). Every --commit-interval-ms (default 500, watchbridge's checkpoint interval) the
 * consumer thread stops the polls' sends (a write lock; a poll sends its items under the read
 * lock), writes to a compacted state topic (--state-topic, default <output-topic>.state,
 * created if missing) each watch that changed since the last commit (its seen ids, or
 * "ended"), sends the input offsets above with sendOffsetsToTransaction(offsets,
 * consumer.groupMetadata()) and commits the transaction. At start it reads the state topic
 * (read_committed) back: ended watches are not started again, unfinished ones resume with
 * their seen ids. So outputs, state and input offsets commit together, and a crash emits
 * nothing twice. A transaction that fails ends the process (exit 1): its restart recovers.
 *
 * No retries with backoff, no per-host limits, no watermarks, no rebalance handling (one
 * instance).
 *
 *   java -cp "<kafka-clients and jackson jars>:<this, compiled>" NaiveBridge \
 *       --bootstrap 127.0.0.1:9092 --group naive --input-topic users --output-topic events \
 *       --url 'http://127.0.0.1:8080/feeds/{id}' [--guarantee exactly_once]
 *
 * Optional: --threads (default 32), --poll-interval seconds (default 1), --session-timeout-ms
 * (the consumer's, default the client's 45 s), --transactional-id (default <group>-tx),
 * --items, --item-key, --item-time, --complete (the response's field names).
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
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReadWriteLock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class NaiveBridge {
    static final ObjectMapper JSON = new ObjectMapper();
    static final Pattern FIELD = Pattern.compile("\\{(\\w+)\\}");
    /** A watch's state record once it ended. */
    static final String ENDED = "ended";
    /** In `changed`: the watch ended (compared by identity). */
    static final Set<String> ENDED_WATCH = Set.of();

    final Map<String, String> args;
    final boolean exactlyOnce;
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

    // exactly_once only.
    /** Held (shared) by a poll while it sends; held alone by a transaction's commit. */
    final ReadWriteLock sending = new ReentrantReadWriteLock();
    /** Watches changed since the last commit: their seen ids, or ENDED_WATCH. */
    final Map<String, Set<String>> changed = new ConcurrentHashMap<>();
    /** Unfinished watches' seen ids, read back from the state topic at start. */
    final Map<String, Set<String>> restored = new HashMap<>();
    /** The offsets the last transaction committed (none sent again while unchanged). */
    Map<TopicPartition, OffsetAndMetadata> committed = Map.of();

    NaiveBridge(Map<String, String> args) {
        this.args = args;
        this.exactlyOnce = switch (args.get("guarantee")) {
            case "at_least_once" -> false;
            case "exactly_once" -> true;
            default -> throw new IllegalArgumentException(
                    "--guarantee must be at_least_once or exactly_once, not " + args.get("guarantee"));
        };
        this.interval = Duration.ofMillis((long) (Double.parseDouble(args.get("poll-interval")) * 1000));
        this.http = HttpClient.newBuilder()
                .version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(10))
                .build();
        Properties p = new Properties();
        p.put("bootstrap.servers", args.get("bootstrap"));
        // watchbridge's producer settings (src/kafka/clients.rs), and librdkafka's default
        // batch.size under them.
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.put("batch.size", "1000000");
        p.put("compression.type", "lz4");
        if (exactlyOnce) {
            p.put("transactional.id", args.getOrDefault("transactional-id", args.get("group") + "-tx"));
        }
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
            // In a transaction: what this poll sends and the watch's state change go into the
            // same one.
            sending.readLock().lock();
            try {
                boolean grew = false;
                for (JsonNode item : body.path(args.get("items"))) {
                    String id = item.path(args.get("item-key")).asText();
                    if (!seen.add(id)) {
                        continue;
                    }
                    grew = true;
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
                boolean complete = body.path(args.get("complete")).asBoolean(false);
                if (exactlyOnce && (grew || complete)) {
                    if (complete) {
                        changed.put(key, ENDED_WATCH);
                    } else {
                        changed.put(key, seen);
                    }
                }
                if (complete) {
                    active.get(tp).remove(offset);
                    return;
                }
            } finally {
                sending.readLock().unlock();
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

    /** Each partition's offset to commit: its oldest active input, else the next to consume. */
    Map<TopicPartition, OffsetAndMetadata> offsets() {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (Map.Entry<TopicPartition, Long> e : consumed.entrySet()) {
            ConcurrentSkipListSet<Long> open = active.get(e.getKey());
            Long oldest = open == null || open.isEmpty() ? null : open.first();
            offsets.put(e.getKey(), new OffsetAndMetadata(oldest == null ? e.getValue() : oldest));
        }
        return offsets;
    }

    /** at_least_once: delivers what was produced, then commits the input offsets. */
    void commit(KafkaConsumer<String, String> consumer) {
        producer.flush();
        Map<TopicPartition, OffsetAndMetadata> offsets = offsets();
        if (!offsets.isEmpty()) {
            consumer.commitSync(offsets);
        }
    }

    /**
     * exactly_once: with the polls' sends held, the changed watches' state and the input
     * offsets into the open transaction, which commits; then the next one begins, unless this
     * was the last (a producer closed in a transaction waits out its close timeout).
     */
    void commitTransaction(KafkaConsumer<String, String> consumer, boolean last) {
        sending.writeLock().lock();
        try {
            String stateTopic = stateTopic();
            for (Map.Entry<String, Set<String>> e : changed.entrySet()) {
                Set<String> seen = e.getValue();
                String value = seen == ENDED_WATCH ? ENDED : JSON.writeValueAsString(new ArrayList<>(seen));
                producer.send(new ProducerRecord<>(stateTopic, e.getKey(), value));
            }
            changed.clear();
            Map<TopicPartition, OffsetAndMetadata> offsets = offsets();
            if (!offsets.isEmpty() && !offsets.equals(committed)) {
                producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                committed = offsets;
            }
            producer.commitTransaction();
            if (!last) {
                producer.beginTransaction();
            }
        } catch (Exception e) {
            System.err.println("transaction failed, exiting (a restart recovers): " + e);
            Runtime.getRuntime().halt(1);
        } finally {
            sending.writeLock().unlock();
        }
    }

    String stateTopic() {
        return args.getOrDefault("state-topic", args.get("output-topic") + ".state");
    }

    /**
     * exactly_once: creates the state topic (compacted, one partition: one instance) if it is
     * missing, and reads it to its end, read_committed: which watches ended (not started
     * again), and the seen ids of those that had not.
     */
    void restore() throws Exception {
        String topic = stateTopic();
        Properties a = new Properties();
        a.put("bootstrap.servers", args.get("bootstrap"));
        try (Admin admin = Admin.create(a)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) -1)
                    .configs(Map.of("cleanup.policy", "compact")))).all().get();
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw e;
            }
        }
        Properties c = new Properties();
        c.put("bootstrap.servers", args.get("bootstrap"));
        c.put("isolation.level", "read_committed");
        c.put("enable.auto.commit", "false");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> state = new KafkaConsumer<>(c)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            state.assign(List.of(tp));
            state.seekToBeginning(List.of(tp));
            long end = state.endOffsets(List.of(tp)).get(tp);
            while (state.position(tp) < end) {
                for (ConsumerRecord<String, String> r : state.poll(Duration.ofMillis(100))) {
                    if (r.value().equals(ENDED)) {
                        restored.remove(r.key());
                        known.add(r.key());
                    } else {
                        Set<String> seen = ConcurrentHashMap.newKeySet();
                        for (JsonNode id : JSON.readTree(r.value())) {
                            seen.add(id.asText());
                        }
                        restored.put(r.key(), seen);
                    }
                }
            }
        }
        System.err.printf("naive bridge (Java): restored %d ended and %d unfinished watches%n",
                known.size(), restored.size());
    }

    void run() throws Exception {
        if (exactlyOnce) {
            producer.initTransactions();
            restore();
        }
        Properties c = new Properties();
        c.put("bootstrap.servers", args.get("bootstrap"));
        c.put("group.id", args.get("group"));
        // Inputs written before the first start are watches too.
        c.put("auto.offset.reset", "earliest");
        c.put("enable.auto.commit", "false");
        if (exactlyOnce) {
            c.put("isolation.level", "read_committed");
        }
        if (args.containsKey("session-timeout-ms")) {
            c.put("session.timeout.ms", args.get("session-timeout-ms"));
        }
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        long every = exactlyOnce ? Long.parseLong(args.get("commit-interval-ms")) * 1_000_000L : 1_000_000_000L;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(List.of(args.get("input-topic")));
            if (exactlyOnce) {
                producer.beginTransaction();
            }
            long nextCommit = System.nanoTime() + every;
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
                    Set<String> before = restored.remove(r.key());
                    Set<String> seen = before != null ? before : ConcurrentHashMap.newKeySet();
                    long offset = r.offset();
                    pool.execute(() -> poll(r.key(), url, tp, offset, seen));
                }
                if (System.nanoTime() > nextCommit) {
                    if (exactlyOnce) {
                        commitTransaction(consumer, false);
                    } else {
                        commit(consumer);
                    }
                    nextCommit = System.nanoTime() + every;
                }
            }
            // Polls in progress finish; polls not yet due are dropped.
            pool.shutdownNow();
            pool.awaitTermination(30, TimeUnit.SECONDS);
            if (exactlyOnce) {
                commitTransaction(consumer, true);
            } else {
                commit(consumer);
            }
        }
        producer.close(Duration.ofSeconds(30));
        int open = active.values().stream().mapToInt(Set::size).sum();
        System.err.printf("naive bridge (Java, %s): %d outputs delivered, %d failed, %d watches still active%n",
                args.get("guarantee"), delivered.get(), failed.get(), open);
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>(Map.of(
                "group", "naive-bridge",
                "items", "items",
                "item-key", "id",
                "item-time", "time",
                "complete", "complete",
                "poll-interval", "1",
                "threads", "32",
                "guarantee", "at_least_once",
                "commit-interval-ms", "500"));
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
