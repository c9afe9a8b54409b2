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

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF3;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Python filters of a Real-time Mode query, called alert by alert.
 *
 * <p>Spark's Python operators exchange rows with their Python worker in batches and read its
 * answers only while their input lasts, so in Real-time Mode, whose input never ends before
 * the checkpoint, a pandas UDF's answers wait for the checkpoint.  This SQL function instead
 * sends one alert (the filters' columns as JSON) to a filter worker of the stream
 * ({@code skyfilter/filtering/filter_workers.py}) over a Unix socket and waits for its verdicts,
 * inside the task's own code.  Each task thread keeps its own connection; the worker answers the
 * requests that wait together (a visit's burst keeps every task busy) with one call per filter.
 *
 * <p>{@value #FUNCTION}(socket, filter_set, row_json) returns the worker's answer: one character
 * per filter ({@code 1} match, {@code 0} no match, {@code n} no verdict), then, when a filter
 * failed on this alert, a line break and the failures as JSON.
 */
public final class PythonFilterCall implements UDF3<String, String, String, String> {

    public static final String FUNCTION = "skyfilter_python_filters";
    private static final long serialVersionUID = 1L;
    private static final ThreadLocal<Map<String, SocketChannel>> CONNECTIONS = ThreadLocal.withInitial(HashMap::new);

    /** Register {@value #FUNCTION} in a session (non-deterministic: called once per row, never folded). */
    public static void register(SparkSession spark) {
        UserDefinedFunction udf = functions.udf(new PythonFilterCall(), DataTypes.StringType).asNondeterministic();
        spark.udf().register(FUNCTION, udf);
    }

    @Override
    public String call(String socket, String filterSet, String row) {
        if (row == null) {
            return null;
        }
        byte[] request = (filterSet + "\n" + row).getBytes(StandardCharsets.UTF_8);
        try {
            return exchange(connection(socket), request);
        } catch (IOException first) {
            close(socket);  // the worker went away (a restart of the filter workers): connect once more
            try {
                return exchange(connection(socket), request);
            } catch (IOException again) {
                close(socket);
                throw new UncheckedIOException("Python filter workers at " + socket + " do not answer", again);
            }
        }
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
