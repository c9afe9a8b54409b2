package skyfilter;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF4;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Python filters (and watchlist matching) of a Real-time Mode query, called alert by alert.
 *
 * <p>Spark's Python operators exchange rows with their Python worker in batches and read its
 * answers only while their input lasts, so in Real-time Mode, whose input never ends before
 * the checkpoint, a pandas UDF's answers wait for the checkpoint.  This SQL function instead
 * sends one alert (the filters' columns as JSON) to a filter worker of its own JVM
 * ({@link FilterWorker}, {@code skyfilter/filtering/filter_workers.py}) over a Unix socket and
 * waits for its verdicts, inside the task's own code.  It runs wherever the task runs (the
 * driver on a local master, each executor on a cluster); each task thread keeps its own
 * connection; the worker answers the requests that wait together with one call per filter.
 *
 * <p>{@value #FUNCTION}(role, set_id, set_json, row_json) returns the worker's answer: one
 * character per filter ({@code 1} match, {@code 0} no match, {@code n} no verdict), then, when
 * a filter failed on this alert, a line break and the failures as JSON.  A worker that cannot
 * start answers "no verdict" for each filter of the set, with the reason as every filter's
 * failure, once per set (the stream quarantines them; the other filters go on).  A watch set's
 * worker that cannot start answers {@value #WATCH_DOWN} (with the reason, once per set): the
 * filters reading the lists and maps get no verdict and are quarantined.
 */
public final class PythonFilterCall implements UDF4<String, String, String, String, String> {

    public static final String FUNCTION = "skyfilter_python_filters";
    private static final long serialVersionUID = 1L;
    private static final ThreadLocal<Map<String, SocketChannel>> CONNECTIONS = ThreadLocal.withInitial(HashMap::new);
    private static final Map<String, FilterWorker> WORKERS = new ConcurrentHashMap<>();
    private static final Set<String> REPORTED = ConcurrentHashMap.newKeySet();  // role/set told its worker is down
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int ATTEMPTS = 4;  // one request, and three after the worker was found gone
    /** The first character of a watch set's answer while its worker cannot start. */
    public static final String WATCH_DOWN = "!";

    /** Register {@value #FUNCTION} in a session (non-deterministic: called once per row, never folded). */
    public static void register(SparkSession spark) {
        UserDefinedFunction udf = functions.udf(new PythonFilterCall(), DataTypes.StringType).asNondeterministic();
        spark.udf().register(FUNCTION, udf);
    }

    @Override
    public String call(String role, String setId, String content, String row) {
        if (row == null) {
            return null;
        }
        FilterWorker worker = WORKERS.computeIfAbsent(role, FilterWorker::new);
        byte[] request = (setId + "\n" + row).getBytes(StandardCharsets.UTF_8);
        String socket;
        try {
            socket = worker.socket();
            worker.publish(setId, content);
        } catch (IOException down) {
            return unavailable(role + "/" + setId, content, row, down);
        }
        IOException failure = null;
        for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
            try {
                if (attempt > 0) {
                    socket = worker.recover();  // killed, or out of memory: started again once it is gone
                }
                return exchange(connection(socket), request);
            } catch (IOException e) {
                close(socket);
                failure = e;
            }
        }
        throw new UncheckedIOException(FilterWorker.where() + ": the Python " + role + " worker at " + socket
                + " does not answer", failure);
    }

    /** The answer while the worker cannot start: no verdicts, and (once per set) the reason for each filter. */
    private static String unavailable(String setKey, String content, String row, IOException down) {
        JsonNode set;
        try {
            set = JSON.readTree(content);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        boolean first = REPORTED.add(setKey);
        if (!set.has("filters")) {
            return first ? WATCH_DOWN + down.getMessage() : WATCH_DOWN;
        }
        String verdicts = "n".repeat(set.get("filters").size());
        if (!first) {
            return verdicts;
        }
        String sample;
        try {
            JsonNode alert = JSON.readTree(row).get("alert_id");
            sample = alert == null || alert.isNull() ? null : alert.asText();
        } catch (IOException e) {
            sample = null;
        }
        ObjectNode failures = JSON.createObjectNode();
        for (JsonNode filter : set.get("filters")) {
            ObjectNode failure = failures.putObject(filter.get("name").asText());
            failure.put("seconds", 0.0).put("error", down.getMessage()).put("sample", sample);
        }
        return verdicts + "\n" + failures;
    }

    private static SocketChannel connection(String socket) throws IOException {
        Map<String, SocketChannel> open = CONNECTIONS.get();
        SocketChannel channel = open.get(socket);
        if (channel == null || !channel.isConnected()) {
            channel = SocketChannel.open(StandardProtocolFamily.UNIX);
            channel.connect(UnixDomainSocketAddress.of(socket));
            open.put(socket, channel);
        }
        return channel;
    }

    private static void close(String socket) {
        SocketChannel channel = CONNECTIONS.get().remove(socket);
        if (channel != null) {
            try {
                channel.close();
            } catch (IOException ignored) {
                // already gone
            }
        }
    }

    private static String exchange(SocketChannel channel, byte[] request) throws IOException {
        ByteBuffer out = ByteBuffer.allocate(4 + request.length);
        out.putInt(request.length).put(request).flip();
        while (out.hasRemaining()) {
            channel.write(out);
        }
        ByteBuffer size = readFully(channel, ByteBuffer.allocate(4));
        int length = size.getInt(0);
        ByteBuffer answer = readFully(channel, ByteBuffer.allocate(length));
        return new String(answer.array(), StandardCharsets.UTF_8);
    }

    private static ByteBuffer readFully(SocketChannel channel, ByteBuffer buffer) throws IOException {
        while (buffer.hasRemaining()) {
            if (channel.read(buffer) < 0) {
                throw new IOException("the Python filter worker closed the connection");
            }
        }
        return buffer;
    }
}
