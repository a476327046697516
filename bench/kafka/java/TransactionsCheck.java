// Kafka's transactional Java producer against a cluster (Apache Kafka or TidalMQ), then a
// read_committed consumer; prints one JSON report line on stdout. Run as a single-file source
// program on the assembled classpath:
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/TransactionsCheck.java \
//       BOOTSTRAP TOPIC TRANSACTIONAL_ID TRANSACTIONS GROUP
//
// The producer runs TRANSACTIONS transactions, each sending one record to every partition of
// TOPIC (value "<transaction>:<partition>") and committing offset <transaction + 1> of TOPIC's
// partition 0 for GROUP with sendOffsetsToTransaction; every third transaction (2, 5, ...) is
// aborted, the others committed. Whether the client runs transaction version 2 (no
// AddPartitionsToTxn / AddOffsetsToTxn, an epoch bump per transaction) is up to what the
// cluster finalizes: the check does not choose. Then a read_committed consumer reads TOPIC from
// the beginning up to its end offsets (the last stable offsets), and an admin client reads
// GROUP's committed offset. The report has what was committed, what was aborted, what was read
// (per partition, in order) and the group's offset; the caller judges them. Exit status 0 when
// every call succeeded.

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TransactionsCheck {
    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: TransactionsCheck BOOTSTRAP TOPIC TRANSACTIONAL_ID "
                    + "TRANSACTIONS GROUP");
            System.exit(2);
        }
        String bootstrap = args[0], topic = args[1], tid = args[2], group = args[4];
        int transactions = Integer.parseInt(args[3]);
        List<String> committed = new ArrayList<>(), aborted = new ArrayList<>();
        List<TopicPartition> partitions = new ArrayList<>();

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, tid);
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            for (PartitionInfo info : producer.partitionsFor(topic)) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            partitions.sort((a, b) -> Integer.compare(a.partition(), b.partition()));
            for (int t = 0; t < transactions; t++) {
                producer.beginTransaction();
                List<String> sent = new ArrayList<>();
                for (TopicPartition tp : partitions) {
                    String value = t + ":" + tp.partition();
                    producer.send(new ProducerRecord<>(topic, tp.partition(), "k", value)).get();
                    sent.add(value);
                }
                producer.sendOffsetsToTransaction(
                        Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(t + 1)),
                        new ConsumerGroupMetadata(group));
                if (t % 3 == 2) {
                    producer.abortTransaction();
                    aborted.addAll(sent);
                } else {
                    producer.commitTransaction();
                    committed.addAll(sent);
                }
            }
        }

        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Map<Integer, List<String>> read = new HashMap<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofSeconds(30));
            long deadline = System.currentTimeMillis() + 30_000;
            while (!caughtUp(consumer, ends)) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("read_committed consumer did not reach " + ends);
                }
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    read.computeIfAbsent(r.partition(), k -> new ArrayList<>()).add(r.value());
                }
            }
        }

        long groupOffset = -1;
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(a)) {
            OffsetAndMetadata o = admin.listConsumerGroupOffsets(group)
                    .partitionsToOffsetAndMetadata().get().get(new TopicPartition(topic, 0));
            if (o != null) {
                groupOffset = o.offset();
            }
        }

        StringBuilder out = new StringBuilder("{\"committed\":").append(json(committed))
                .append(",\"aborted\":").append(json(aborted)).append(",\"read\":{");
        boolean first = true;
        for (TopicPartition tp : partitions) {
            out.append(first ? "" : ",").append('"').append(tp.partition()).append("\":")
                    .append(json(read.getOrDefault(tp.partition(), List.of())));
            first = false;
        }
        out.append("},\"group_offset\":").append(groupOffset).append('}');
        System.out.println(out);
    }

    static boolean caughtUp(KafkaConsumer<String, String> consumer, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> e : ends.entrySet()) {
            if (consumer.position(e.getKey()) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    static String json(List<String> values) {
        StringBuilder b = new StringBuilder("[");
        for (int i = 0; i < values.size(); i++) {
            b.append(i == 0 ? "" : ",").append('"').append(values.get(i)).append('"');
        }
        return b.append(']').toString();
    }
}
