// A Kafka Connect sink connector of the tests (kafkasink/connect_test.go): its task appends to a
// file one JSON line per record saying what Connect's converters made of the record. Only the
// Connect API and the JDK.
package pgreorder.connect;

import java.util.Collections;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

public class PrintSinkConnector extends SinkConnector {
    /** The file the task appends its lines to. */
    public static final String FILE = "file";

    static final ConfigDef CONFIG = new ConfigDef()
            .define(FILE, ConfigDef.Type.STRING, ConfigDef.NO_DEFAULT_VALUE, ConfigDef.Importance.HIGH,
                    "The file each record's rendering is appended to, one JSON line per record.");

    private Map<String, String> props;

    @Override
    public void start(Map<String, String> props) {
        CONFIG.parse(props);
        this.props = props;
    }

    @Override
    public Class<? extends Task> taskClass() {
        return PrintSinkTask.class;
    }

    /** One task whatever tasks.max says: the lines of one writer never interleave. */
    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.singletonList(props);
    }

    @Override
    public void stop() {
    }

    @Override
    public ConfigDef config() {
        return CONFIG;
    }

    @Override
    public String version() {
        return "1";
    }
}
