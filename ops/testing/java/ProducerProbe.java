// The Java client (org.apache.kafka:kafka-clients) against a server: pidctl or Kafka itself.
// Compiled by the tests with javac against Kafka's class path (ops/testing/java_client.py);
// driven by tests/ops/testing/test_java_client.py. No build tool.
//
//   java ProducerProbe idempotent BOOTSTRAP TOPIC
//   java ProducerProbe transactional BOOTSTRAP TRANSACTIONAL_ID
//
// Every observation is one line "EVENT {json}" on stdout. The client's own log goes to stderr
// (log4j2-probe.properties): its line "ProducerId set to P with epoch E" is how a user reads
// the producer id, and the tests read it there too. The program also reads the same pair
// from the producer's TransactionManager (a private field, by reflection) and reports it, with
// isTransactionV2Enabled(): which transaction protocol the client chose from the server's
// ApiVersions (the finalized feature transaction.version >= 2 selects the new one, KIP-890).

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class ProducerProbe {
    // Every blocking call of the client waits at most this long (max.block.ms): a call that
    // does not fail fast shows up as a TimeoutException after it, not as a hung test.
    static final int MAX_BLOCK_MS = 30_000;
    // How long an idempotent producer may take to get its producer id.
    static final long PID_WAIT_MS = 60_000;
    // max.block.ms of the producer that sends one record: how long send() waits for the
    // topic's metadata (pidctl hosts no topic, so against it that wait is the whole story).
    static final int SEND_BLOCK_MS = 5_000;

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "idempotent" -> idempotent(args[1], args[2]);
            case "transactional" -> transactional(args[1], args[2]);
            default -> throw new IllegalArgumentException("unknown command " + args[0]);
        }
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String clientId, String transactionalId) {
        return producer(bootstrap, clientId, transactionalId, MAX_BLOCK_MS);
    }

    static KafkaProducer<byte[], byte[]> producer(
            String bootstrap, String clientId, String transactionalId, int maxBlockMs) {
        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        config.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Integer.toString(maxBlockMs));
        if (transactionalId != null) {
            config.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        }
        return new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer());
    }

    /**
     * An idempotent producer gets its producer id when it starts, without sending; then
     * another one sends one record to {@code topic}.
     */
    static void idempotent(String bootstrap, String topic) throws Exception {
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, "probe-idempotent", null)) {
            Object manager = transactionManager(producer);
            Method hasProducerId = manager.getClass().getMethod("hasProducerId");
            long deadline = System.currentTimeMillis() + PID_WAIT_MS;
            while (!(Boolean) hasProducerId.invoke(manager)) {
                if (System.currentTimeMillis() > deadline) {
                    event("{\"event\":\"no-producer-id\",\"waited_ms\":" + PID_WAIT_MS + "}");
                    return;
                }
                Thread.sleep(20);
            }
            event("{\"event\":\"producer-id\",\"client\":\"probe-idempotent\"," + pair(manager) + "}");
        }
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, "probe-send", null, SEND_BLOCK_MS)) {
            long start = System.nanoTime();
            try {
                RecordMetadata sent = producer.send(new ProducerRecord<>(topic, "v".getBytes()))
                        .get(MAX_BLOCK_MS, TimeUnit.MILLISECONDS);
                event("{\"event\":\"sent\",\"client\":\"probe-send\",\"partition\":"
                        + sent.partition() + ",\"offset\":" + sent.offset() + "}");
            } catch (ExecutionException e) {
                failed("probe-send", "send", (RuntimeException) e.getCause(), start, SEND_BLOCK_MS);
            } catch (RuntimeException e) {
                failed("probe-send", "send", e, start, SEND_BLOCK_MS);
            }
        }
    }

    /**
     * Two instances with one transactional id: each initTransactions(); then the first, now
     * fenced, makes its next transactional call (a transaction with consumer offsets, which
     * needs no topic), and the second does the same.
     */
    static void transactional(String bootstrap, String transactionalId) throws Exception {
        try (KafkaProducer<byte[], byte[]> first = producer(bootstrap, "probe-first", transactionalId);
             KafkaProducer<byte[], byte[]> second = producer(bootstrap, "probe-second", transactionalId)) {
            initialize("probe-first", first);
            initialize("probe-second", second);
            transaction("probe-first", first, bootstrap);
            transaction("probe-second", second, bootstrap);
        }
    }

    static void initialize(String client, KafkaProducer<byte[], byte[]> producer) throws Exception {
        long start = System.nanoTime();
        try {
            producer.initTransactions();
        } catch (RuntimeException e) {
            failed(client, "initTransactions", e, start);
            return;
        }
        Object manager = transactionManager(producer);
        event("{\"event\":\"initialized\",\"client\":\"" + client + "\"," + pair(manager) + "}");
    }

    /** beginTransaction, sendOffsetsToTransaction, commitTransaction: each step reported. */
    static void transaction(String client, KafkaProducer<byte[], byte[]> producer, String bootstrap)
            throws Exception {
        String call = "beginTransaction";
        long start = System.nanoTime();
        try {
            producer.beginTransaction();
            call = "sendOffsetsToTransaction";
            start = System.nanoTime();
            producer.sendOffsetsToTransaction(
                    Map.of(new TopicPartition("probe-input", 0), new OffsetAndMetadata(1)),
                    groupMetadata(bootstrap));
            call = "commitTransaction";
            start = System.nanoTime();
            producer.commitTransaction();
        } catch (RuntimeException e) {
            failed(client, call, e, start);
            return;
        }
        Object manager = transactionManager(producer);
        event("{\"event\":\"committed\",\"client\":\"" + client + "\"," + pair(manager) + "}");
    }

    /** A consumer group's metadata as a consumer reports it (it needs no connection). */
    static ConsumerGroupMetadata groupMetadata(String bootstrap) {
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ConsumerConfig.GROUP_ID_CONFIG, "probe-group");
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(config, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            return consumer.groupMetadata();
        }
    }

    static void failed(String client, String call, RuntimeException e, long start) {
        failed(client, call, e, start, MAX_BLOCK_MS);
    }

    static void failed(String client, String call, RuntimeException e, long start, int maxBlockMs) {
        long ms = (System.nanoTime() - start) / 1_000_000;
        Throwable cause = e.getCause();
        event("{\"event\":\"failed\",\"client\":\"" + client + "\",\"call\":\"" + call
                + "\",\"exception\":\"" + e.getClass().getName() + "\",\"message\":" + quote(e.getMessage())
                + ",\"cause\":" + (cause == null ? "null" : quote(cause.getClass().getName()))
                + ",\"cause_message\":" + (cause == null ? "null" : quote(cause.getMessage()))
                + ",\"elapsed_ms\":" + ms + ",\"max_block_ms\":" + maxBlockMs + "}");
    }

    /** The producer's TransactionManager: KafkaProducer keeps it in a private field. */
    static Object transactionManager(KafkaProducer<byte[], byte[]> producer) throws Exception {
        Field field = KafkaProducer.class.getDeclaredField("transactionManager");
        field.setAccessible(true);
        return field.get(producer);
    }

    /** "producer_id", "epoch" and "transaction_v2" as the TransactionManager holds them. */
    static String pair(Object manager) throws Exception {
        Method current = manager.getClass().getDeclaredMethod("producerIdAndEpoch");
        current.setAccessible(true);
        Object pair = current.invoke(manager);
        long producerId = pair.getClass().getField("producerId").getLong(pair);
        short epoch = pair.getClass().getField("epoch").getShort(pair);
        boolean v2 = (Boolean) manager.getClass().getMethod("isTransactionV2Enabled").invoke(manager);
        return "\"producer_id\":" + producerId + ",\"epoch\":" + epoch + ",\"transaction_v2\":" + v2;
    }

    static void event(String json) {
        System.out.println("EVENT " + json);
        System.out.flush();
    }

    static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}
