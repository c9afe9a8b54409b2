package skyfilter;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.core.Core;
import org.apache.logging.log4j.core.LogEvent;
import org.apache.logging.log4j.core.appender.rewrite.RewritePolicy;
import org.apache.logging.log4j.core.config.plugins.Plugin;
import org.apache.logging.log4j.core.config.plugins.PluginFactory;
import org.apache.logging.log4j.core.impl.Log4jLogEvent;

/**
 * Spark's log events of tasks it killed on purpose, demoted to DEBUG: they go to the log file, not the console.
 *
 * <p>Stopping a streaming query cancels its running job.  A Real-time Mode query always has
 * one running (its long-lived tasks), so every stop of one (the warm-up's, a restart's, the
 * night's end) makes each task log {@code ERROR Utils: Aborting task} with a
 * {@code TaskKilledException}, then {@code ERROR DataWritingSparkTask: Aborting commit} and
 * {@code Aborted commit} on the same thread, and the scheduler a {@code WARN TaskSetManager:
 * Lost task ... TaskKilled}; a Python task, {@code WARN PythonRunner: Incomplete task interrupted};
 * and the query's own thread {@code ERROR WriteToDataSourceV2Exec: Data source write support ... is aborting}
 * (only for a query skyfilter said it stops, {@link #queryStopping}); a stopped query whose job had
 * already ended, {@code WARN DAGScheduler: Failed to cancel job group ... Cannot find active jobs}.
 * None is a failure.  A task that fails for any other reason keeps
 * its ERROR lines, and Spark's own report of a failed query is untouched.
 *
 * <p>Used by {@code conf/spark-log4j2.properties} as the policy of a Rewrite appender.
 */
@Plugin(name = "ExpectedCancellations", category = Core.CATEGORY_NAME, elementType = "rewritePolicy",
        printObject = true)
public final class ExpectedCancellations implements RewritePolicy {
    /** What a killed task's code throws: Spark's own kill, or the interrupt it sends the task's thread. */
    private static final Set<String> KILLED = Set.of("org.apache.spark.TaskKilledException",
            "java.lang.InterruptedException", "java.nio.channels.ClosedByInterruptException",
            "org.apache.kafka.common.errors.InterruptException");
    private static final String WRITING_TASK = "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask";
    private static final String TASK_SET = "org.apache.spark.scheduler.TaskSetManager";
    private static final String PYTHON_RUNNER = "org.apache.spark.api.python.PythonRunner";
    private static final String WRITE_EXEC = "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec";
    private static final String DAG_SCHEDULER = "org.apache.spark.scheduler.DAGScheduler";

    /** Run ids of the streaming queries skyfilter is stopping: their write's abort on the driver is expected. */
    private static final Set<String> STOPPING = ConcurrentHashMap.newKeySet();

    /** Whether the last event of this thread was a killed task's: its abort lines follow on the same thread. */
    private static final ThreadLocal<Boolean> KILLED_ON_THIS_THREAD = ThreadLocal.withInitial(() -> false);

    @PluginFactory
    public static ExpectedCancellations create() {
        return new ExpectedCancellations();
    }

    /**
     * Called just before skyfilter stops the streaming query of {@code runId}: the abort of the write its
     * cancelled job was doing, logged on the query's own thread (named after its run id), is expected.
     */
    public static void queryStopping(String runId) {
        STOPPING.add("runId = " + runId + "]");
    }

    @Override
    public LogEvent rewrite(LogEvent event) {
        if (!event.getLevel().isMoreSpecificThan(Level.WARN)) {
            return event;
        }
        boolean killed = causedByKill(event.getThrown());
        boolean expected = killed
                || KILLED_ON_THIS_THREAD.get() && WRITING_TASK.equals(event.getLoggerName())
                        && message(event).startsWith("Abort")
                || TASK_SET.equals(event.getLoggerName()) && message(event).contains("TaskKilled (")
                || PYTHON_RUNNER.equals(event.getLoggerName())
                        && message(event).startsWith("Incomplete task interrupted")
                || WRITE_EXEC.equals(event.getLoggerName()) && message(event).startsWith("Data source write support")
                        && stopping(event.getThreadName())
                || DAG_SCHEDULER.equals(event.getLoggerName()) && message(event).startsWith("Failed to cancel job group")
                        && message(event).contains("Cannot find active jobs");
        KILLED_ON_THIS_THREAD.set(killed || expected && WRITING_TASK.equals(event.getLoggerName()));
        return expected ? new Log4jLogEvent.Builder(event).setLevel(Level.DEBUG).build() : event;
    }

    private static boolean stopping(String thread) {
        for (String runId : STOPPING) {
            if (thread != null && thread.contains(runId)) {
                return true;
            }
        }
        return false;
    }

    private static boolean causedByKill(Throwable thrown) {
        for (Throwable cause = thrown; cause != null; cause = cause.getCause()) {
            if (KILLED.contains(cause.getClass().getName())) {
                return true;
            }
            if (cause.getCause() == cause) {
                break;
            }
        }
        return false;
    }

    private static String message(LogEvent event) {
        return event.getMessage() == null ? "" : event.getMessage().getFormattedMessage();
    }
}
