package skyfilter;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.net.DatagramPacket;
import java.net.DatagramSocket;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF5;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Where a Real-time query's tasks have read to, per input partition, as they read.
 *
 * <p>A Real-time query reports its offsets only at its checkpoints (minutes apart), so its lag
 * read from the checkpoint is a sawtooth of that period.  Each input row passes through the SQL
 * function {@value #FUNCTION}(reader, topic, partition, offset, timestamp_ms), which always keeps
 * the row and notes, per (reader, topic, partition), the next offset to read, the Kafka append
 * time of the last row read, and how many rows were read.  The driver reads the marks
 * ({@link #snapshot}) for its metrics and its consumer-group commits.  A row read again after a
 * restart moves no mark back.
 *
 * <p>The tasks of a local master run in the driver's JVM.  On a cluster they run in executors:
 * the driver then listens for marks ({@link #serve}), the reader is named
 * {@code name@host:port/token}, and each executor JVM sends the marks that moved to that address
 * five times a second, in UDP datagrams (a lost one is made good by the next: marks only grow).
 */
public final class ReadMarks implements UDF5<String, String, Integer, Long, Long, Boolean> {

    public static final String FUNCTION = "skyfilter_read_mark";
    private static final long serialVersionUID = 1L;
    private static final long SEND_EVERY_MS = 200;
    private static final int DATAGRAM_BYTES = 60_000;
    private static final Map<String, Mark> MARKS = new ConcurrentHashMap<>();
    private static final Set<String> MOVED = ConcurrentHashMap.newKeySet();  // keys to send to their driver
    private static final String SENDER = ManagementFactory.getRuntimeMXBean().getName();  // pid@host
    private static DatagramSocket listening;  // the driver's, once it serves
    private static String token;
    private static Thread sending;  // an executor's

    /** One partition's mark: the next offset, the last append time, the rows read (updated by one task at a time);
     * in the driver, the rows each executor JVM has read of it. */
    private static final class Mark {
        volatile long nextOffset = -1;
        volatile long timestampMs = -1;
        volatile long rows = 0;
        final Map<String, Long> rowsBySender = new ConcurrentHashMap<>();

        synchronized void advance(long next, long timestamp) {
            if (next > nextOffset) {
                nextOffset = next;
                timestampMs = timestamp;
            }
        }

        long totalRows() {
            return rows + rowsBySender.values().stream().mapToLong(Long::longValue).sum();
        }
    }

    /** Register {@value #FUNCTION} in a session (non-deterministic: Spark calls it once per row, never folds it). */
    public static void register(SparkSession spark) {
        UserDefinedFunction udf = functions.udf(new ReadMarks(), DataTypes.BooleanType).asNondeterministic();
        spark.udf().register(FUNCTION, udf);
    }

    @Override
    public Boolean call(String reader, String topic, Integer partition, Long offset, Long timestampMs) {
        if (offset == null || partition == null) {
            return Boolean.TRUE;
        }
        String key = reader + '\t' + topic + '\t' + partition;
        Mark mark = MARKS.computeIfAbsent(key, k -> new Mark());
        synchronized (mark) {
            mark.rows += 1;
            mark.advance(offset + 1, timestampMs == null ? -1 : timestampMs);
        }
        int at = reader.indexOf('@');
        if (at >= 0 && !reader.endsWith("/" + token)) {  // a cluster's executor: tell the driver
            MOVED.add(key);
            startSending(reader.substring(at + 1));
        }
        return Boolean.TRUE;
    }

    /** Listen for the executors' marks (one listener per driver JVM); the suffix of a reader's name that has
     * the executors send them to {@code host}: {@code @host:port/token}. */
    public static synchronized String serve(String host) throws IOException {
        if (listening == null) {
            token = Long.toHexString(ThreadLocalRandom.current().nextLong());
            listening = new DatagramSocket(new InetSocketAddress(0));
            Thread receiving = new Thread(ReadMarks::receive, "skyfilter-read-marks");
            receiving.setDaemon(true);
            receiving.start();
        }
        return "@" + host + ":" + listening.getLocalPort() + "/" + token;
    }

    private static void receive() {
        byte[] buffer = new byte[65_536];
        while (true) {
            DatagramPacket packet = new DatagramPacket(buffer, buffer.length);
            try {
                listening.receive(packet);
            } catch (IOException closed) {
                return;
            }
            String[] lines = new String(packet.getData(), 0, packet.getLength(), StandardCharsets.UTF_8).split("\n");
            if (lines.length < 2 || !lines[0].equals(token)) {
                continue;  // not one of this driver's executors
            }
            String sender = lines[1];
            for (int i = 2; i < lines.length; i++) {
                String[] fields = lines[i].split("\t");  // reader, topic, partition, next offset, time, rows
                if (fields.length != 6) {
                    continue;
                }
                String key = fields[0] + '\t' + fields[1] + '\t' + fields[2];
                Mark mark = MARKS.computeIfAbsent(key, k -> new Mark());
                mark.advance(Long.parseLong(fields[3]), Long.parseLong(fields[4]));
                mark.rowsBySender.merge(sender, Long.parseLong(fields[5]), Math::max);
            }
        }
    }

    private static synchronized void startSending(String address) {
        if (sending != null) {
            return;
        }
        int colon = address.lastIndexOf(':');
        int slash = address.indexOf('/', colon);
        InetSocketAddress driver = new InetSocketAddress(address.substring(0, colon),
                Integer.parseInt(address.substring(colon + 1, slash)));
        String header = address.substring(slash + 1) + "\n" + SENDER + "\n";
        sending = new Thread(() -> send(driver, header), "skyfilter-read-marks-sender");
        sending.setDaemon(true);
        sending.start();
    }

    private static void send(InetSocketAddress driver, String header) {
        try (DatagramSocket socket = new DatagramSocket()) {
            while (true) {
                Thread.sleep(SEND_EVERY_MS);
                StringBuilder lines = new StringBuilder(header);
                for (String key : MOVED) {
                    MOVED.remove(key);
                    Mark mark = MARKS.get(key);
                    lines.append(key).append('\t').append(mark.nextOffset).append('\t').append(mark.timestampMs)
                         .append('\t').append(mark.rows).append('\n');
                    if (lines.length() > DATAGRAM_BYTES) {
                        flush(socket, driver, lines);
                        lines.setLength(0);
                        lines.append(header);
                    }
                }
                if (lines.length() > header.length()) {
                    flush(socket, driver, lines);
                }
            }
        } catch (IOException | InterruptedException stopped) {
            // the executor is going away
        }
    }

    private static void flush(DatagramSocket socket, InetSocketAddress driver, StringBuilder lines) {
        byte[] data = lines.toString().getBytes(StandardCharsets.UTF_8);
        try {
            socket.send(new DatagramPacket(data, data.length, driver));
        } catch (IOException lost) {
            // the next round sends the marks again once they move
        }
    }

    /** The marks of {@code reader}: one tab-separated line per partition (topic, partition, next offset,
     * last append time in ms, rows read since the JVMs reading it started). */
    public static String snapshot(String reader) {
        StringBuilder lines = new StringBuilder();
        String prefix = reader + '\t';
        for (Map.Entry<String, Mark> entry : MARKS.entrySet()) {
            if (entry.getKey().startsWith(prefix)) {
                Mark mark = entry.getValue();
                lines.append(entry.getKey().substring(prefix.length())).append('\t').append(mark.nextOffset)
                     .append('\t').append(mark.timestampMs).append('\t').append(mark.totalRows()).append('\n');
            }
        }
        return lines.toString();
    }

    /** Forget the marks of {@code reader} (a stream whose topic was recreated reads from lower offsets). */
    public static void forget(String reader) {
        MARKS.keySet().removeIf(key -> key.startsWith(reader + '\t'));
    }
}
