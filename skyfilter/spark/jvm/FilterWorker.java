package skyfilter;

import java.io.IOException;
import java.lang.ProcessBuilder.Redirect;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.SparkEnv;

/**
 * One Python filter worker of this JVM (a driver on a local master, an executor on a cluster):
 * {@code python -m skyfilter.filtering.filter_workers}, started on first use by the task that
 * needs it, shared by every task of the JVM, started again when it has died.
 *
 * <p>The filter sets the tasks name are written into the worker's folder from the query itself
 * (each request carries its set's id and content), so no file has to reach the executors apart
 * from the query.  The Python is {@code spark.skyfilter.filterWorkerPython} when set, else Spark's
 * own for this JVM: {@code spark.pyspark.python}, else {@code PYSPARK_PYTHON}, else {@code python3}.
 */
final class FilterWorker {

    /** The Spark setting naming another Python for the workers (filters needing packages Spark's lacks). */
    static final String PYTHON_SETTING = "spark.skyfilter.filterWorkerPython";
    private static final long START_TIMEOUT_MS = 120_000;
    private static final long RETRY_AFTER_MS = 30_000;
    private static final long RECOVER_WAIT_MS = 1_000;  // how long a broken connection's worker may take to die  // a worker that could not start is tried again after this

    private final String role;
    private final Set<String> written = ConcurrentHashMap.newKeySet();
    private Path folder;
    private Process process;
    private String failure;  // why the last start failed (null: it did not)
    private long failedAt;

    FilterWorker(String role) {
        this.role = role;
    }

    /** The worker's socket, the worker started first if it is not running (an IOException says why it cannot). */
    synchronized String socket() throws IOException {
        if (process != null && process.isAlive()) {
            return socketPath().toString();
        }
        if (failure != null && System.currentTimeMillis() - failedAt < RETRY_AFTER_MS) {
            throw new IOException(failure);
        }
        try {
            start();
            failure = null;
            return socketPath().toString();
        } catch (IOException e) {
            failure = e.getMessage();
            failedAt = System.currentTimeMillis();
            throw e;
        }
    }

    /**
     * After a connection broke: the socket of a worker that answers, waiting for a killed one to be gone
     * (a process killed a moment ago may still look alive and still hold its socket) and starting another.
     */
    String recover() throws IOException {
        Process dying;
        synchronized (this) {
            dying = process;
        }
        if (dying != null) {
            try {
                dying.waitFor(RECOVER_WAIT_MS, java.util.concurrent.TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        return socket();
    }

    /** Write a filter set for the worker to load when a request names it (once per set and worker folder). */
    void publish(String setId, String content) throws IOException {
        if (written.contains(setId)) {
            return;
        }
        synchronized (this) {  // the tasks of a JVM meet a new set together
            if (written.contains(setId)) {
                return;
            }
            Path target = folder().resolve(setId + ".json");
            Path partial = folder().resolve(setId + ".partial");
            Files.write(partial, content.getBytes(StandardCharsets.UTF_8));
            Files.move(partial, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            written.add(setId);
        }
    }

    private synchronized Path folder() throws IOException {
        if (folder == null) {
            folder = Files.createTempDirectory("skyfilter-" + role + "-");  // short: a socket path has 107 bytes
            folder.toFile().deleteOnExit();
        }
        return folder;
    }

    private Path socketPath() throws IOException {
        return folder().resolve("worker.sock");
    }

    private void start() throws IOException {
        Path socket = socketPath();
        Files.deleteIfExists(socket);
        Path log = folder().resolve("worker.log");
        ProcessBuilder builder = new ProcessBuilder(List.of(python(), "-m", "skyfilter.filtering.filter_workers",
                "--socket", socket.toString()));
        builder.redirectErrorStream(true).redirectOutput(Redirect.appendTo(log.toFile()));
        try {
            process = builder.start();
        } catch (IOException e) {
            throw new IOException(where() + ": the Python " + role + " worker did not start: " + e.getMessage(), e);
        }
        long deadline = System.currentTimeMillis() + START_TIMEOUT_MS;
        while (!Files.exists(socket)) {
            if (!process.isAlive() || System.currentTimeMillis() > deadline) {
                String cause = process.isAlive() ? "no socket after " + START_TIMEOUT_MS / 1000 + " s"
                        : "exit code " + process.exitValue();
                process.destroyForcibly();
                throw new IOException(where() + ": the Python " + role + " worker did not start (" + cause + "): "
                        + lastLine(log) + " (command: " + String.join(" ", builder.command()) + ")");
            }
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException(where() + ": interrupted while the Python " + role + " worker started", e);
            }
        }
    }

    /** This JVM as the driver's console should name it: its executor id and host. */
    static String where() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            host = "unknown host";
        }
        SparkEnv env = SparkEnv.get();
        return "executor " + (env == null ? "?" : env.executorId()) + " on " + host;
    }

    private static String python() {
        String fallback = System.getenv().getOrDefault("PYSPARK_PYTHON", "python3");
        SparkEnv env = SparkEnv.get();
        return env == null ? fallback
                : env.conf().get(PYTHON_SETTING, env.conf().get("spark.pyspark.python", fallback));
    }

    private static String lastLine(Path log) {
        try {
            List<String> lines = Files.readAllLines(log, StandardCharsets.UTF_8);
            for (int i = lines.size() - 1; i >= 0; i--) {
                if (!lines.get(i).isBlank()) {
                    return lines.get(i).strip();
                }
            }
        } catch (IOException e) {
            return "its output could not be read (" + e.getMessage() + ")";
        }
        return "it printed nothing";
    }
}
