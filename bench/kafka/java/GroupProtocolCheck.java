// Checks the consumer group protocol (KIP-848, `group.protocol=consumer`) of a cluster with two
// Apache Kafka Java consumers, and prints one JSON report line on stdout. Run as a single-file
// source program on the assembled classpath:
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/GroupProtocolCheck.java \
//       BOOTSTRAP TOPIC GROUP PARTITIONS PER_ROUND HOLD_FILE
// TOPIC must exist with PARTITIONS partitions. Rounds, each producing PER_ROUND keyed records:
//   1. consumer A alone: it gets every partition;
//   2. consumer B joins: the partitions are shared (each holds some, none both);
//   3. B closes (it leaves the group): A takes every partition again.
// Both consumers commit synchronously after each poll's records (enable.auto.commit=false), so
// after a revocation nothing may be read twice. Then A goes on polling, and the program writes
// HOLD_FILE and waits (up to 60 s) until that file is deleted, so a tool can describe the live
// group, before A closes. Exit status 0 only if every record was read exactly once and the
// assignments were as above.

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class GroupProtocolCheck {
    static final long PHASE_TIMEOUT_MS = 30_000;

    /** One consumer polling in its own thread, keeping what it read and what it holds. */
    static final class Member implements Runnable {
        final String name;
        final KafkaConsumer<String, String> consumer;
        final Set<String> read = ConcurrentHashMap.newKeySet();  // "partition:offset"
        final List<String> duplicates = new ArrayList<>();
        volatile Set<Integer> assignment = Set.of();
        volatile String error = null;
        final AtomicBoolean stop = new AtomicBoolean();
        final Thread thread;

        Member(String name, String bootstrap, String topic, String group) {
            this.name = name;
            Properties props = new Properties();
            props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
            props.put(ConsumerConfig.CLIENT_ID_CONFIG, "group-protocol-check-" + name);
            props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            consumer = new KafkaConsumer<>(props);
            consumer.subscribe(List.of(topic));
            thread = new Thread(this, "consumer-" + name);
        }

        public void run() {
            try {
                while (!stop.get()) {
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(100))) {
                        if (!read.add(r.partition() + ":" + r.offset())) {
                            duplicates.add(r.partition() + ":" + r.offset());
                        }
                    }
                    consumer.commitSync();
                    Set<Integer> now = new TreeSet<>();
                    for (TopicPartition tp : consumer.assignment()) now.add(tp.partition());
                    assignment = now;
                }
            } catch (Exception e) {
                error = e.toString();
            } finally {
                consumer.close();  // leaves the group
            }
        }

        void close() throws InterruptedException {
            stop.set(true);
            thread.join(PHASE_TIMEOUT_MS);
        }
    }

    interface Condition { boolean holds(); }

    static void await(String what, Condition condition) throws InterruptedException {
        long deadline = System.currentTimeMillis() + PHASE_TIMEOUT_MS;
        while (!condition.holds()) {
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("timed out: " + what);
            Thread.sleep(50);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: GroupProtocolCheck BOOTSTRAP TOPIC GROUP PARTITIONS PER_ROUND HOLD_FILE");
            System.exit(2);
        }
        String bootstrap = args[0], topic = args[1], group = args[2];
        int partitions = Integer.parseInt(args[3]), perRound = Integer.parseInt(args[4]);
        Path hold = Path.of(args[5]);
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        Set<Integer> all = new TreeSet<>();
        for (int p = 0; p < partitions; p++) all.add(p);
        StringBuilder report = new StringBuilder("{\"group\":\"" + group + "\"");
        String failure = null;
        Member a = null, b = null;
        int produced = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            a = new Member("a", bootstrap, topic, group);
            a.thread.start();
            produced = produce(producer, topic, partitions, perRound, produced);
            final Member ma = a;
            final int round1 = produced;
            await("A alone holds every partition and read round 1",
                  () -> ma.assignment.equals(all) && ma.read.size() >= round1);
            report.append(",\"alone\":").append(a.assignment);

            b = new Member("b", bootstrap, topic, group);
            b.thread.start();
            final Member mb = b;
            await("A and B share the partitions", () -> {
                Set<Integer> x = ma.assignment, y = mb.assignment;
                Set<Integer> both = new HashSet<>(x);
                both.retainAll(y);
                Set<Integer> union = new TreeSet<>(x);
                union.addAll(y);
                return !x.isEmpty() && !y.isEmpty() && both.isEmpty() && union.equals(all);
            });
            report.append(",\"shared\":{\"a\":").append(a.assignment).append(",\"b\":").append(b.assignment).append('}');
            produced = produce(producer, topic, partitions, perRound, produced);
            final int round2 = produced;
            await("round 2 read", () -> ma.read.size() + mb.read.size() >= round2);
            report.append(",\"b_read\":").append(b.read.size());

            b.close();
            produced = produce(producer, topic, partitions, perRound, produced);
            final int round3 = produced;
            await("A takes every partition after B left and reads round 3",
                  () -> ma.assignment.equals(all) && ma.read.size() + mb.read.size() >= round3);
            report.append(",\"after_leave\":").append(a.assignment);

            Files.writeString(hold, group);
            long deadline = System.currentTimeMillis() + 60_000;
            while (Files.exists(hold) && System.currentTimeMillis() < deadline) Thread.sleep(100);
        } catch (IllegalStateException e) {
            failure = e.getMessage();
        } finally {
            if (a != null) a.close();
            if (b != null) b.close();
        }
        Set<String> union = new HashSet<>(a.read);
        int overlap = 0;
        if (b != null) {
            for (String r : b.read) if (!union.add(r)) overlap++;
        }
        int duplicates = a.duplicates.size() + (b == null ? 0 : b.duplicates.size()) + overlap;
        report.append(",\"produced\":").append(produced)
              .append(",\"read\":").append(union.size())
              .append(",\"duplicates\":").append(duplicates)
              .append(",\"errors\":[").append(a.error == null ? "" : q(a.error))
              .append(b != null && b.error != null ? (a.error == null ? "" : ",") + q(b.error) : "")
              .append("],\"failure\":").append(failure == null ? "null" : q(failure)).append('}');
        System.out.println(report);
        boolean ok = failure == null && duplicates == 0 && union.size() == produced
            && a.error == null && (b == null || b.error == null);
        System.exit(ok ? 0 : 1);
    }

    /** PER_ROUND records, keyed so that every partition gets some; returns the total so far. */
    static int produce(KafkaProducer<String, String> producer, String topic, int partitions,
                       int count, int before) throws Exception {
        List<java.util.concurrent.Future<?>> acks = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            int n = before + i;
            acks.add(producer.send(new ProducerRecord<>(topic, n % partitions, "k" + n, "v" + n)));
        }
        for (java.util.concurrent.Future<?> f : acks) f.get();
        return before + count;
    }

    static String q(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n") + "\"";
    }
}
