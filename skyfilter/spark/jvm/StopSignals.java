package skyfilter;

import java.util.concurrent.atomic.AtomicInteger;

import sun.misc.Signal;

/**
 * SIGTERM and SIGINT sent to spark-submit's process (the driver JVM) stop the Python job cleanly.
 *
 * <p>spark-submit runs the job's Python process as a child of its JVM, and the JVM's own
 * reaction to SIGTERM is to exit at once (code 143) with the Python job under it.  What
 * operators signal is that process: {@code $!} after {@code spark-submit ... &}, systemd's
 * main pid, a Kubernetes container's first process.  Once the Python job installs this
 * handler, the first signal is passed on to it as SIGTERM (it stops its lanes, lets the
 * archive catch up, prints its summary and exits 0, and the JVM with it); a second
 * signal ends the job and the JVM at once.
 */
public final class StopSignals {
    private static final AtomicInteger SIGNALS = new AtomicInteger();
    private static volatile long pythonPid = -1;

    private StopSignals() {
    }

    /** Pass SIGTERM and SIGINT on to the Python process {@code pid}; returns the signals handled here. */
    public static synchronized String install(long pid) {
        pythonPid = pid;
        StringBuilder handled = new StringBuilder();
        for (String name : new String[] {"TERM", "INT"}) {
            try {
                Signal.handle(new Signal(name), StopSignals::received);
                handled.append(handled.length() == 0 ? "" : ",").append("SIG").append(name);
            } catch (IllegalArgumentException ignored) {
                // the JVM was started ignoring it (PySpark's own launcher does so for SIGINT): Python gets it alone
            }
        }
        return handled.toString();
    }

    /** How many stop signals arrived. */
    public static int received() {
        return SIGNALS.get();
    }

    private static void received(Signal signal) {
        ProcessHandle python = ProcessHandle.of(pythonPid).orElse(null);
        if (SIGNALS.incrementAndGet() == 1 && python != null) {
            python.destroy();  // SIGTERM: the Python job's clean stop
            return;
        }
        if (python != null) {
            python.descendants().forEach(ProcessHandle::destroyForcibly);
            python.destroyForcibly();
        }
        Runtime.getRuntime().halt(128 + signal.getNumber());
    }
}
