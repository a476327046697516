// Consume-transform-produce with Kafka's Java clients: the Java twin of the librdkafka copier of
// tests/support/txn_checker.py (run_copier), run beside it under the same faults against
// Apache Kafka and TidalMQ. Run as a single-file source program on the assembled classpath:
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/TransactionalCopier.java \
//       BOOTSTRAP SOURCE SINK GROUP TRANSACTIONAL_ID
//
// A read_committed consumer (GROUP, every partition of SOURCE assigned) and a transactional
// producer: each batch polled is written to the same partition of SINK in one transaction that
// also commits the consumer's positions for GROUP (sendOffsetsToTransaction). After any error
// the transaction is settled (aborted; if the producer cannot abort, a new producer with the
// same transactional id fences it, which completes or aborts it first) and the consumer rewinds
// to GROUP's committed offsets, so SINK holds every SOURCE record exactly once and in order if
// transactional offsets are committed with their records. One transaction in ten is aborted on
// purpose after its copies are written, and the batch copied again: SINK holds aborted records,
// which a read_committed reader must not see. Prints RUNNING once it reads; when its standard
// input closes it copies on until SOURCE's end offsets (as they are then), prints one JSON
// report line ({"transactions": committed, "aborted": on purpose, "slowest_ms": the longest
// transaction until settled, "producers": transactional producers made (1 + one per
// incarnation after a failed abort), "errors": {exception: count}}) and exits 0; 1 if it
// could not catch up within 90 s.

import java.io.IOException;
import java.io.InputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class TransactionalCopier {
    static final long CATCH_UP_MS = 90_000;
    static final int ABORT_EVERY = 10;  // transactions, of which one is aborted on purpose
    static final Map<String, Integer> errors = new TreeMap<>();
    static volatile boolean stopping = false;
    static long slowestMs = 0;  // the longest transaction, from its begin until settled
    static int producers = 0;  // transactional producers made: more than 1 after a fencing

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: TransactionalCopier BOOTSTRAP SOURCE SINK GROUP "
                    + "TRANSACTIONAL_ID");
            System.exit(2);
        }
        String bootstrap = args[0], source = args[1], sink = args[2], group = args[3];
        String tid = args[4];
        Thread stdin = new Thread(() -> {
            try {
                InputStream in = System.in;
                while (in.read() >= 0) {
                    // nothing: the caller only closes it
                }
            } catch (IOException e) {
                // closed all the same
            }
            stopping = true;
        });
        stdin.setDaemon(true);
        stdin.start();

        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
                ByteArrayDeserializer.class.getName());
        long transactions = 0, aborted = 0, attempts = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(source, Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(source, info.partition()));
            }
            consumer.assign(parts);
            rewind(consumer, parts);
            KafkaProducer<byte[], byte[]> producer = newProducer(bootstrap, tid);
            System.out.println("RUNNING");
            System.out.flush();

            Map<TopicPartition, Long> ends = null;
            long deadline = Long.MAX_VALUE;
            while (true) {
                if (stopping && ends == null) {
                    ends = endOffsets(consumer, parts);
                    deadline = System.currentTimeMillis() + CATCH_UP_MS;
                }
                if (ends != null && caughtUp(consumer, ends)) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    System.err.println("did not reach the end of " + source + ": " + ends);
                    report(transactions, aborted);
                    producer.close(Duration.ZERO);
                    System.exit(1);
                }
                ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(200));
                if (batch.isEmpty()) {
                    continue;
                }
                long began = System.currentTimeMillis();
                try {
                    producer.beginTransaction();
                    for (ConsumerRecord<byte[], byte[]> r : batch) {
                        producer.send(new ProducerRecord<>(sink, r.partition(), r.key(), r.value()));
                    }
                    Map<TopicPartition, OffsetAndMetadata> positions = new HashMap<>();
                    for (TopicPartition tp : parts) {
                        positions.put(tp, new OffsetAndMetadata(consumer.position(tp)));
                    }
                    producer.sendOffsetsToTransaction(positions, new ConsumerGroupMetadata(group));
                    if (++attempts % ABORT_EVERY == 0) {
                        // on purpose: the copies are written (flushed), then aborted, and the
                        // batch is copied again; a reader that saw aborted records would see
                        // them twice
                        producer.flush();
                        producer.abortTransaction();
                        aborted++;
                        rewind(consumer, parts);
                        continue;
                    }
                    producer.commitTransaction();
                    transactions++;
                } catch (KafkaException | IllegalStateException e) {
                    count(e);
                    try {
                        producer.abortTransaction();
                    } catch (RuntimeException abortFailed) {
                        // fenced, fatal, or a commit that timed out: its outcome is the
                        // coordinator's, which the next incarnation waits for
                        count(abortFailed);
                        producer.close(Duration.ZERO);
                        producer = newProducer(bootstrap, tid);
                    }
                    rewind(consumer, parts);
                } finally {
                    slowestMs = Math.max(slowestMs, System.currentTimeMillis() - began);
                }
            }
            producer.close(Duration.ofSeconds(10));
        }
        report(transactions, aborted);
    }

    static KafkaProducer<byte[], byte[]> newProducer(String bootstrap, String tid) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, tid);
        // as the librdkafka copier (tests/support/txn_checker.py, TRANSACTION_TIMEOUT_MS)
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "2");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
        producers++;
        for (int attempt = 1; ; attempt++) {
            try {
                producer.initTransactions();  // may be retried after a timeout
                return producer;
            } catch (TimeoutException e) {
                count(e);
                if (attempt == 3) {
                    throw e;
                }
            }
        }
    }

    /** Seeks every partition to GROUP's committed offset (the start if none). */
    static void rewind(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> parts) {
        for (int attempt = 1; ; attempt++) {
            try {
                Map<TopicPartition, OffsetAndMetadata> committed =
                        consumer.committed(new HashSet<>(parts), Duration.ofSeconds(30));
                for (TopicPartition tp : parts) {
                    OffsetAndMetadata o = committed.get(tp);
                    consumer.seek(tp, o == null ? 0 : o.offset());
                }
                return;
            } catch (TimeoutException e) {
                count(e);
                if (attempt == 3) {
                    throw e;
                }
            }
        }
    }

    static Map<TopicPartition, Long> endOffsets(
            KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> parts) {
        for (int attempt = 1; ; attempt++) {
            try {
                return consumer.endOffsets(parts, Duration.ofSeconds(30));
            } catch (TimeoutException e) {
                count(e);
                if (attempt == 3) {
                    throw e;
                }
            }
        }
    }

    static boolean caughtUp(KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> e : ends.entrySet()) {
            if (consumer.position(e.getKey()) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    static void count(Exception e) {
        Throwable cause = e.getCause() != null && e instanceof KafkaException
                && e.getClass() == KafkaException.class ? e.getCause() : e;
        errors.merge(cause.getClass().getSimpleName(), 1, Integer::sum);
        System.err.println("copier error: " + e);
    }

    static void report(long transactions, long aborted) {
        StringBuilder out = new StringBuilder("{\"transactions\":").append(transactions)
                .append(",\"aborted\":").append(aborted)
                .append(",\"slowest_ms\":").append(slowestMs)
                .append(",\"producers\":").append(producers).append(",\"errors\":{");
        boolean first = true;
        for (Map.Entry<String, Integer> e : errors.entrySet()) {
            out.append(first ? "" : ",").append('"').append(e.getKey()).append("\":")
                    .append(e.getValue());
            first = false;
        }
        System.out.println(out.append("}}"));
        System.out.flush();
    }
}
