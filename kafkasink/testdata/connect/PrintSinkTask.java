// The task of PrintSinkConnector: for each SinkRecord it appends one line to the file, a JSON
// object
//
//   {"topic":T,"partition":P,"offset":O,"key":DATA,"value":DATA,"headers":[HEADER...]}
//
// where DATA is {"schema":SCHEMA or null,"value":VALUE} (what the key or value converter made of
// the bytes), SCHEMA is
//
//   {"type":"struct"|"int32"|...,"name":N,"version":V,"parameters":{...},"optional":B,
//    "default":VALUE,"doc":D,"fields":[{"name":F,"index":I,"schema":SCHEMA}...],
//    "items":SCHEMA,"keys":SCHEMA,"values":SCHEMA}
//
// (name, version, parameters, default, doc, fields, items, keys and values only when the schema
// has them; fields in the schema's order, parameters sorted by name), VALUE renders a Struct as an
// object of its fields in the schema's order, a List as an array, a Map as an array of [key,
// value] pairs sorted by the keys' rendering, a Struct's null field as null even when its schema
// has a default (Struct.getWithoutDefault), byte[] and ByteBuffer as base64 strings,
// BigDecimal as its plain string, java.util.Date as its epoch milliseconds, a float or double
// that JSON cannot write (NaN, infinities) as a string, other numbers, booleans and strings as
// themselves, and HEADER is {"key":K,"type":T or null,"name":N or null,"value":S or null}, S the
// header's value as org.apache.kafka.connect.data.Values writes it as a string.
package pgreorder.connect;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.Date;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.data.Values;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

public class PrintSinkTask extends SinkTask {
    private OutputStream out;

    @Override
    public String version() {
        return "1";
    }

    @Override
    public void start(Map<String, String> props) {
        String file = PrintSinkConnector.CONFIG.parse(props).get(PrintSinkConnector.FILE).toString();
        try {
            out = new FileOutputStream(file, true);
        } catch (IOException e) {
            throw new ConnectException("opening " + file, e);
        }
    }

    /** Writes the lines of records, whole, at once. */
    @Override
    public void put(Collection<SinkRecord> records) {
        if (records.isEmpty()) {
            return;
        }
        StringBuilder b = new StringBuilder();
        for (SinkRecord r : records) {
            b.append("{\"topic\":");
            string(b, r.topic());
            b.append(",\"partition\":").append(r.kafkaPartition());
            b.append(",\"offset\":").append(r.kafkaOffset());
            b.append(",\"key\":");
            data(b, r.keySchema(), r.key());
            b.append(",\"value\":");
            data(b, r.valueSchema(), r.value());
            b.append(",\"headers\":[");
            String sep = "";
            for (Header h : r.headers()) {
                b.append(sep).append("{\"key\":");
                sep = ",";
                string(b, h.key());
                Schema s = h.schema();
                b.append(",\"type\":");
                string(b, s == null ? null : s.type().getName());
                b.append(",\"name\":");
                string(b, s == null ? null : s.name());
                b.append(",\"value\":");
                string(b, h.value() == null ? null : Values.convertToString(s, h.value()));
                b.append('}');
            }
            b.append("]}\n");
        }
        try {
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
        } catch (IOException e) {
            throw new ConnectException("writing records", e);
        }
    }

    @Override
    public void stop() {
        try {
            if (out != null) {
                out.close();
            }
        } catch (IOException e) {
            throw new ConnectException("closing", e);
        }
    }

    static void data(StringBuilder b, Schema s, Object v) {
        b.append("{\"schema\":");
        schema(b, s);
        b.append(",\"value\":");
        value(b, s, v);
        b.append('}');
    }

    static void schema(StringBuilder b, Schema s) {
        if (s == null) {
            b.append("null");
            return;
        }
        b.append("{\"type\":");
        string(b, s.type().getName());
        if (s.name() != null) {
            b.append(",\"name\":");
            string(b, s.name());
        }
        if (s.version() != null) {
            b.append(",\"version\":").append(s.version());
        }
        if (s.parameters() != null) {
            b.append(",\"parameters\":{");
            String sep = "";
            for (Map.Entry<String, String> p : new TreeMap<>(s.parameters()).entrySet()) {
                b.append(sep);
                sep = ",";
                string(b, p.getKey());
                b.append(':');
                string(b, p.getValue());
            }
            b.append('}');
        }
        b.append(",\"optional\":").append(s.isOptional());
        if (s.defaultValue() != null) {
            b.append(",\"default\":");
            value(b, s, s.defaultValue());
        }
        if (s.doc() != null) {
            b.append(",\"doc\":");
            string(b, s.doc());
        }
        switch (s.type()) {
            case STRUCT:
                b.append(",\"fields\":[");
                String sep = "";
                for (Field f : s.fields()) {
                    b.append(sep).append("{\"name\":");
                    sep = ",";
                    string(b, f.name());
                    b.append(",\"index\":").append(f.index()).append(",\"schema\":");
                    schema(b, f.schema());
                    b.append('}');
                }
                b.append(']');
                break;
            case ARRAY:
                b.append(",\"items\":");
                schema(b, s.valueSchema());
                break;
            case MAP:
                b.append(",\"keys\":");
                schema(b, s.keySchema());
                b.append(",\"values\":");
                schema(b, s.valueSchema());
                break;
            default:
        }
        b.append('}');
    }

    /** Renders v, of schema s (null when schemaless). */
    static void value(StringBuilder b, Schema s, Object v) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof Struct) {
            Struct st = (Struct) v;
            b.append('{');
            String sep = "";
            for (Field f : st.schema().fields()) {
                b.append(sep);
                sep = ",";
                string(b, f.name());
                b.append(':');
                // What the converter put in: Struct.get would return the field's default
                // in place of a null.
                value(b, f.schema(), st.getWithoutDefault(f.name()));
            }
            b.append('}');
        } else if (v instanceof List) {
            Schema items = s == null ? null : s.valueSchema();
            b.append('[');
            String sep = "";
            for (Object o : (List<?>) v) {
                b.append(sep);
                sep = ",";
                value(b, items, o);
            }
            b.append(']');
        } else if (v instanceof Map) {
            Schema ks = s == null ? null : s.keySchema();
            Schema vs = s == null ? null : s.valueSchema();
            TreeMap<String, String> pairs = new TreeMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                StringBuilder k = new StringBuilder();
                value(k, ks, e.getKey());
                StringBuilder p = new StringBuilder("[").append(k).append(',');
                value(p, vs, e.getValue());
                pairs.put(k.toString(), p.append(']').toString());
            }
            b.append('[').append(String.join(",", new ArrayList<>(pairs.values()))).append(']');
        } else if (v instanceof byte[]) {
            string(b, Base64.getEncoder().encodeToString((byte[]) v));
        } else if (v instanceof ByteBuffer) {
            ByteBuffer bb = ((ByteBuffer) v).duplicate();
            byte[] bytes = new byte[bb.remaining()];
            bb.get(bytes);
            string(b, Base64.getEncoder().encodeToString(bytes));
        } else if (v instanceof BigDecimal) {
            string(b, ((BigDecimal) v).toPlainString());
        } else if (v instanceof Date) {
            b.append(((Date) v).getTime());
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                string(b, v.toString());
            } else {
                b.append(v);
            }
        } else if (v instanceof Number || v instanceof Boolean) {
            b.append(v);
        } else if (v instanceof String) {
            string(b, (String) v);
        } else {
            throw new ConnectException("cannot render a " + v.getClass().getName() + ": " + v);
        }
    }

    static void string(StringBuilder b, String s) {
        if (s == null) {
            b.append("null");
            return;
        }
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    b.append("\\\"");
                    break;
                case '\\':
                    b.append("\\\\");
                    break;
                case '\n':
                    b.append("\\n");
                    break;
                case '\r':
                    b.append("\\r");
                    break;
                case '\t':
                    b.append("\\t");
                    break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }
}
