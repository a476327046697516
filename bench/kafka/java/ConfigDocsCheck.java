// DescribeConfigs with and without IncludeDocumentation (v3+), through the Apache Kafka Java
// AdminClient (DescribeConfigsOptions.includeDocumentation), on Apache Kafka or TidalMQ. Prints
// one JSON report line on stdout. Run as a single-file source program on the assembled classpath:
//   java -cp "<cache>/kafka/<version>/lib/*" bench/kafka/java/ConfigDocsCheck.java BOOTSTRAP TOPIC BROKER
//
// It describes the topic TOPIC and the broker BROKER twice, asking for the documentation and
// not, and reports each config's documentation (null when absent):
//   {"topic":{"with":{name:doc,...},"without":{...}},"broker":{"with":{...},"without":{...}}}

import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.common.config.ConfigResource;

public class ConfigDocsCheck {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: ConfigDocsCheck BOOTSTRAP TOPIC BROKER");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        ConfigResource topic = new ConfigResource(ConfigResource.Type.TOPIC, args[1]);
        ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, args[2]);
        StringBuilder out = new StringBuilder("{");
        try (Admin admin = Admin.create(props)) {
            boolean first = true;
            for (ConfigResource resource : List.of(topic, broker)) {
                out.append(first ? "" : ",").append(q(resource == topic ? "topic" : "broker"));
                out.append(":{\"with\":").append(docs(admin, resource, true));
                out.append(",\"without\":").append(docs(admin, resource, false)).append("}");
                first = false;
            }
        }
        System.out.println(out.append("}"));
    }

    private static String docs(Admin admin, ConfigResource resource, boolean include)
            throws Exception {
        DescribeConfigsOptions options = new DescribeConfigsOptions().includeDocumentation(include);
        Map<ConfigResource, Config> described =
                admin.describeConfigs(List.of(resource), options).all().get(30, TimeUnit.SECONDS);
        Map<String, String> byName = new TreeMap<>();
        for (ConfigEntry entry : described.get(resource).entries()) {
            byName.put(entry.name(), entry.documentation());
        }
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, String> e : byName.entrySet()) {
            b.append(b.length() > 1 ? "," : "").append(q(e.getKey())).append(":").append(q(e.getValue()));
        }
        return b.append("}").toString();
    }

    private static String q(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
