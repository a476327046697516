// What the Apache Kafka Java client gets from a cluster (Apache Kafka or TidalMQ) for four
// everyday operations, as one JSON line on stdout: "ok", or the simple name of the exception the
// client raised (TopicAuthorizationException, GroupAuthorizationException, ...), so the same
// ACLs can be checked against both. Run as a single-file source program on the assembled
// classpath (bench/kafka/harness.py java_acl_check):
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/AclCheck.java BOOTSTRAP TOPIC GROUP NEW_TOPIC
// produce: a KafkaProducer on default settings (idempotence on) sends one record to TOPIC.
// consume: a KafkaConsumer in group GROUP subscribes to TOPIC and polls until it has a record.
// describe_configs: Admin.describeConfigs of TOPIC.
// create_topic: Admin.createTopics of NEW_TOPIC (1 partition).
// With CLIENT_CHECK_CONFIG naming a client.properties, every client starts from it.

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class AclCheck {
    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: AclCheck BOOTSTRAP TOPIC GROUP NEW_TOPIC");
            System.exit(2);
        }
        String bootstrap = args[0], topic = args[1], group = args[2], newTopic = args[3];
        StringBuilder out = new StringBuilder("{");
        out.append("\"produce\":").append(q(attempt(() -> produce(bootstrap, topic))));
        out.append(",\"consume\":").append(q(attempt(() -> consume(bootstrap, topic, group))));
        out.append(",\"describe_configs\":").append(q(attempt(() -> describeConfigs(bootstrap, topic))));
        out.append(",\"create_topic\":").append(q(attempt(() -> createTopic(bootstrap, newTopic))));
        System.out.println(out.append("}"));
    }

    static Properties base(String bootstrap) throws IOException {
        Properties props = new Properties();
        String config = System.getenv("CLIENT_CHECK_CONFIG");
        if (config != null && !config.isEmpty()) {
            try (InputStream in = new FileInputStream(config)) {
                props.load(in);
            }
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "15000");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        return props;
    }

    static String attempt(Callable<String> op) {
        try {
            return op.call();
        } catch (Throwable e) {
            Throwable cause = e;
            while ((cause instanceof ExecutionException || cause.getClass().getName().startsWith(
                    "org.apache.kafka.common.KafkaException")) && cause.getCause() != null) {
                cause = cause.getCause();
            }
            return cause.getClass().getSimpleName();
        }
    }

    static String produce(String bootstrap, String topic) throws Exception {
        Properties props = base(bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "15000");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "15000");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.send(new ProducerRecord<>(topic, "k", "v")).get();
        }
        return "ok";
    }

    static String consume(String bootstrap, String topic, String group) throws Exception {
        Properties props = base(bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 20000;
            while (System.currentTimeMillis() < deadline) {
                if (!consumer.poll(Duration.ofMillis(500)).isEmpty()) {
                    consumer.commitSync();
                    return "ok";
                }
            }
        }
        return "nothing read";
    }

    static String describeConfigs(String bootstrap, String topic) throws Exception {
        try (Admin admin = Admin.create(base(bootstrap))) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            admin.describeConfigs(List.of(resource)).all().get();
        }
        return "ok";
    }

    static String createTopic(String bootstrap, String name) throws Exception {
        try (Admin admin = Admin.create(base(bootstrap))) {
            admin.createTopics(List.of(new NewTopic(name, 1, (short) 1))).all().get();
        }
        return "ok";
    }

    static String q(String s) {
        return s == null ? "null" : "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }
}
