package skyfilter;

import java.lang.reflect.Method;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.TaskContext;
import org.apache.spark.TaskFailedReason;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.apache.spark.sql.internal.ReadOnlySQLConf;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.internal.SQLConf$;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One SQL configuration per task, made once when the task starts (a Spark plugin: {@code spark.plugins}).
 *
 * <p>Inside a task, Spark's {@code SQLConf.get} builds a new read-only configuration on every
 * call unless one is set for the thread, and Spark 4.2 calls it once per field of every row
 * it creates for a nested record ({@code SpecificInternalRow} asks its types framework, which
 * reads a flag).  Decoding a Rubin alert builds thousands of them: a JFR profile of the
 * delivery lane's Real-time tasks found 30% of their samples there.  This plugin sets, as the
 * task starts, the configuration those calls would build (the same local properties, read
 * live), on the task's own thread, and removes it when the task ends; code that sets its
 * own ({@code SQLConf.withExistingConf}) still wins while it runs.  The thread-local it sets
 * is private to Spark: if a later Spark no longer has it, the plugin logs one warning and
 * does nothing (tasks run as Spark alone runs them).
 */
public final class TaskConf implements SparkPlugin {

    private static final Logger LOG = LoggerFactory.getLogger(TaskConf.class);
    private static final ThreadLocal<SQLConf> EXISTING = existingConf();
    private static final AtomicLong SERVED = new AtomicLong();

    @Override
    public DriverPlugin driverPlugin() {
        return null;
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new PerTask();
    }

    /** Whether tasks get their configuration once (Spark still has the thread-local this needs). */
    public static boolean active() {
        return EXISTING != null;
    }

    /** Tasks of this JVM that started with their configuration set by the plugin. */
    public static long tasksServed() {
        return SERVED.get();
    }

    @SuppressWarnings("unchecked")
    private static ThreadLocal<SQLConf> existingConf() {
        try {
            Method method = SQLConf$.class.getDeclaredMethod("existingConf");
            method.setAccessible(true);
            return (ThreadLocal<SQLConf>) method.invoke(SQLConf$.MODULE$);
        } catch (ReflectiveOperationException | RuntimeException gone) {
            LOG.warn("skyfilter.TaskConf: this Spark has no SQLConf.existingConf ({}); tasks build their SQL "
                     + "configuration as Spark does", gone.toString());
            return null;
        }
    }

    private static final class PerTask implements ExecutorPlugin {

        @Override
        public void init(PluginContext context, Map<String, String> extraConf) {
            // nothing: the thread-local is looked up once per JVM
        }

        @Override
        public void onTaskStart() {
            TaskContext task = TaskContext.get();
            if (EXISTING != null && task != null) {  // set anew: never one left by an earlier task
                EXISTING.set(new ReadOnlySQLConf(task));
                SERVED.incrementAndGet();
            }
        }

        @Override
        public void onTaskSucceeded() {
            clear();
        }

        @Override
        public void onTaskFailed(TaskFailedReason reason) {
            clear();
        }

        private static void clear() {
            if (EXISTING != null) {
                EXISTING.remove();
            }
        }
    }
}
