package skyfilter;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

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
 * time of the last row read, and how many rows were read.  The tasks of a local master run in the
 * driver's JVM, so the driver reads the marks ({@link #snapshot}) for its metrics and its
 * consumer-group commits.  A row read again after a restart moves no mark back.
 */
public final class ReadMarks implements UDF5<String, String, Integer, Long, Long, Boolean> {

    public static final String FUNCTION = "skyfilter_read_mark";
    private static final long serialVersionUID = 1L;
    private static final Map<String, Mark> MARKS = new ConcurrentHashMap<>();

    /** One partition's mark: the next offset, the last append time, the rows read (updated by one task at a time). */
    private static final class Mark {
        volatile long nextOffset = -1;
        volatile long timestampMs = -1;
        volatile long rows = 0;
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
        Mark mark = MARKS.computeIfAbsent(reader + '\t' + topic + '\t' + partition, key -> new Mark());
        synchronized (mark) {
            mark.rows += 1;
            if (offset + 1 > mark.nextOffset) {
                mark.nextOffset = offset + 1;
                mark.timestampMs = timestampMs == null ? -1 : timestampMs;
            }
        }
        return Boolean.TRUE;
    }

    /** The marks of {@code reader}: one tab-separated line per partition (topic, partition, next offset,
     * last append time in ms, rows read since this JVM started). */
    public static String snapshot(String reader) {
        StringBuilder lines = new StringBuilder();
        String prefix = reader + '\t';
        for (Map.Entry<String, Mark> entry : MARKS.entrySet()) {
            if (entry.getKey().startsWith(prefix)) {
                Mark mark = entry.getValue();
                lines.append(entry.getKey().substring(prefix.length())).append('\t').append(mark.nextOffset)
                     .append('\t').append(mark.timestampMs).append('\t').append(mark.rows).append('\n');
            }
        }
        return lines.toString();
    }

    /** Forget the marks of {@code reader} (a stream whose topic was recreated reads from lower offsets). */
    public static void forget(String reader) {
        MARKS.keySet().removeIf(key -> key.startsWith(reader + '\t'));
    }
}
