package skyfilter;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF6;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Per-visit broker caps for Real-time Mode: which matches of a visit a capped broker receives.
 *
 * <p>Real-time Mode has no stateful operators, and a visit's alerts arrive on every input
 * partition, each read by its own long-lived task.  The tasks of a local master all run in the
 * driver's JVM, so they share one ledger per stream: the first {@code cap} matches of a (broker,
 * visit) to reach it are admitted, in arrival order, the rest are refused.  An admission is
 * appended to the stream's ledger file before it is answered, so a restarted stream (its tasks
 * resend what they wrote since their last checkpoint) admits the same alerts again and never a
 * new one beyond the cap.  Asking again about an alert gives the same answer.
 *
 * <p>On a cluster the tasks run in executors: the driver also serves its ledgers over TCP
 * ({@link #serve}), and a task whose JVM does not hold the ledger asks the driver, one request per
 * capped match on a connection each task thread keeps (the answer, as locally, is given after the
 * admission is written).  The ledger's address is then {@code name@host:port/token}; a bare
 * {@code name} is a ledger of the task's own JVM.
 *
 * <p>The stream calls the SQL function {@value #FUNCTION}(ledger, broker, night, visit_id,
 * alert_id, cap); the driver opens the ledger first ({@link #open}) and reads the counts per
 * (night, visit, broker) at each checkpoint ({@link #drainCounts}).
 */
public final class VisitCapLedger implements UDF6<String, String, String, Long, String, Integer, Boolean> {

    public static final String FUNCTION = "skyfilter_visit_cap";
    private static final long serialVersionUID = 1L;
    private static final int RECENT_ENTRIES = 4096;  // (broker, visit)s whose refusals are remembered (figures only)
    private static final Map<String, Ledger> LEDGERS = new ConcurrentHashMap<>();
    private static final ThreadLocal<Map<String, Remote>> REMOTES = ThreadLocal.withInitial(HashMap::new);
    private static ServerSocket server;
    private static String token;

    /** Register {@value #FUNCTION} in a session (non-deterministic: Spark calls it once per row and reference). */
    public static void register(SparkSession spark) {
        UserDefinedFunction udf = functions.udf(new VisitCapLedger(), DataTypes.BooleanType).asNondeterministic();
        spark.udf().register(FUNCTION, udf);
    }

    /** Open (or reopen) the ledger {@code name}, kept in {@code file}: admissions younger than {@code keepHours}. */
    public static synchronized int open(String name, String file, double keepHours) throws IOException {
        Ledger ledger = new Ledger(Path.of(file), (long) (keepHours * 3_600_000L));
        Ledger old = LEDGERS.put(name, ledger);
        if (old != null) {
            old.close();
        }
        return ledger.admittedCount();
    }

    /** Close the ledger {@code name} (a stream stopping). */
    public static synchronized void close(String name) throws IOException {
        Ledger ledger = LEDGERS.remove(name);
        if (ledger != null) {
            ledger.close();
        }
    }

    /** Matches seen and admitted per (night, visit, broker) since the last call, as tab-separated lines. */
    public static String drainCounts(String name) {
        Ledger ledger = LEDGERS.get(name);
        return ledger == null ? "" : ledger.drainCounts();
    }

    /**
     * Serve this JVM's ledgers to tasks in other JVMs (once per JVM: every later call returns the same
     * endpoint); the address of ledger {@code name} as executors reach it at {@code host}.
     */
    public static synchronized String serve(String name, String host) throws IOException {
        if (server == null) {
            token = Long.toHexString(ThreadLocalRandom.current().nextLong());
            server = new ServerSocket();
            server.bind(new InetSocketAddress(0), 64);
            Thread accepting = new Thread(VisitCapLedger::accept, "skyfilter-visit-cap-server");
            accepting.setDaemon(true);
            accepting.start();
        }
        return name + "@" + host + ":" + server.getLocalPort() + "/" + token;
    }

    @Override
    public Boolean call(String address, String broker, String night, Long visit, String alertId, Integer cap) {
        int at = address.indexOf('@');
        String name = at < 0 ? address : address.substring(0, at);
        String visitText = visit == null ? "" : visit.toString();
        Ledger ledger = LEDGERS.get(name);
        if (ledger != null) {
            return ledger.admit(broker, night == null ? "" : night, visitText, alertId, cap);
        }
        if (at < 0) {
            throw new IllegalStateException("visit cap ledger '" + name + "' is not open in this JVM and has no "
                    + "address: the driver serves it to executors (VisitCapLedger.serve)");
        }
        String request = String.join("\t", name, broker, night == null ? "" : night, visitText, alertId,
                String.valueOf(cap));
        Map<String, Remote> open = REMOTES.get();
        try {
            return open.computeIfAbsent(address, Remote::new).ask(request);
        } catch (IOException first) {
            closeRemote(address);  // the connection broke (the driver's ledger server restarted): once more
            try {
                return open.computeIfAbsent(address, Remote::new).ask(request);
            } catch (IOException again) {
                closeRemote(address);
                throw new UncheckedIOException("visit cap ledger at " + address.substring(at + 1)
                        + " does not answer", again);
            }
        }
    }

    private static void closeRemote(String address) {
        Remote remote = REMOTES.get().remove(address);
        if (remote != null) {
            remote.close();
        }
    }

    private static void accept() {
        while (true) {
            try {
                Socket connection = server.accept();
                Thread answering = new Thread(() -> answer(connection), "skyfilter-visit-cap-connection");
                answering.setDaemon(true);
                answering.start();
            } catch (IOException e) {
                return;  // the server socket closed
            }
        }
    }

    /** Answer one task thread's requests: {@code token}, then lines of tab-separated arguments; 1, 0 or e<why>. */
    private static void answer(Socket connection) {
        try (connection;
             BufferedReader in = new BufferedReader(new InputStreamReader(connection.getInputStream(),
                     StandardCharsets.UTF_8));
             BufferedWriter out = new BufferedWriter(new OutputStreamWriter(connection.getOutputStream(),
                     StandardCharsets.UTF_8))) {
            connection.setTcpNoDelay(true);
            if (!token.equals(in.readLine())) {
                return;
            }
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                String[] part = line.split("\t", -1);
                Ledger ledger = part.length == 6 ? LEDGERS.get(part[0]) : null;
                String reply;
                if (ledger == null) {
                    reply = "eno open visit cap ledger '" + part[0] + "' in the driver";
                } else {
                    try {
                        reply = ledger.admit(part[1], part[2], part[3], part[4], Integer.parseInt(part[5])) ? "1"
                                : "0";
                    } catch (RuntimeException e) {
                        reply = "e" + e.getMessage();
                    }
                }
                out.write(reply.replace('\n', ' ') + "\n");
                out.flush();
            }
        } catch (IOException e) {
            // the task went away
        }
    }

    /** A task thread's connection to the driver's ledger server. */
    private static final class Remote {
        private final Socket socket;
        private final BufferedReader in;
        private final BufferedWriter out;

        Remote(String address) {
            int at = address.indexOf('@');
            int colon = address.lastIndexOf(':');
            int slash = address.lastIndexOf('/');
            try {
                socket = new Socket(address.substring(at + 1, colon),
                        Integer.parseInt(address.substring(colon + 1, slash)));
                socket.setTcpNoDelay(true);
                in = new BufferedReader(new InputStreamReader(socket.getInputStream(), StandardCharsets.UTF_8));
                out = new BufferedWriter(new OutputStreamWriter(socket.getOutputStream(), StandardCharsets.UTF_8));
                out.write(address.substring(slash + 1) + "\n");
            } catch (IOException e) {
                throw new UncheckedIOException("visit cap ledger at " + address.substring(at + 1)
                        + " cannot be reached", e);
            }
        }

        boolean ask(String request) throws IOException {
            out.write(request + "\n");
            out.flush();
            String reply = in.readLine();
            if (reply == null) {
                throw new IOException("the driver closed the connection");
            }
            if (reply.startsWith("e")) {
                throw new IllegalStateException("visit cap ledger: " + reply.substring(1));
            }
            return reply.equals("1");
        }

        void close() {
            try {
                socket.close();
            } catch (IOException ignored) {
                // already gone
            }
        }
    }

    /** One stream's admissions: in memory, and appended to its file. */
    private static final class Ledger {
        private final Map<String, Set<String>> admitted = new HashMap<>();  // broker \t visit -> alert ids
        private final LinkedHashMap<String, Set<String>> refused = new LinkedHashMap<>(16, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Set<String>> eldest) {
                return size() > RECENT_ENTRIES;
            }
        };
        private final Map<String, long[]> counts = new HashMap<>();  // night \t visit \t broker -> seen, admitted
        private final BufferedWriter out;

        Ledger(Path file, long keepMillis) throws IOException {
            Files.createDirectories(file.toAbsolutePath().getParent());
            List<String> kept = new ArrayList<>();
            long oldest = System.currentTimeMillis() - keepMillis;
            if (Files.exists(file)) {
                for (String line : Files.readAllLines(file, StandardCharsets.UTF_8)) {
                    String[] parts = line.split("\t", 4);  // time, broker, visit, alert id
                    if (parts.length == 4 && Long.parseLong(parts[0]) >= oldest) {
                        admitted.computeIfAbsent(parts[1] + "\t" + parts[2], k -> new HashSet<>()).add(parts[3]);
                        kept.add(line);
                    }
                }
            }
            Path compacted = file.resolveSibling(file.getFileName() + ".new");
            Files.write(compacted, kept, StandardCharsets.UTF_8);
            Files.move(compacted, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            out = Files.newBufferedWriter(file, StandardCharsets.UTF_8, StandardOpenOption.APPEND);
        }

        synchronized boolean admit(String broker, String night, String visit, String alertId, int cap) {
            String key = broker + "\t" + visit;
            Set<String> in = admitted.computeIfAbsent(key, k -> new HashSet<>());
            if (in.contains(alertId)) {
                return true;
            }
            Set<String> out_ = refused.computeIfAbsent(key, k -> new HashSet<>());
            if (out_.contains(alertId)) {
                return false;
            }
            long[] count = counts.computeIfAbsent(night + "\t" + visit + "\t" + broker, k -> new long[2]);
            count[0]++;
            if (in.size() >= cap) {
                out_.add(alertId);
                return false;
            }
            try {
                out.write(System.currentTimeMillis() + "\t" + key + "\t" + alertId + "\n");
                out.flush();
            } catch (IOException e) {
                throw new UncheckedIOException("visit cap ledger: could not record an admission", e);
            }
            in.add(alertId);
            count[1]++;
            return true;
        }

        synchronized String drainCounts() {
            StringBuilder lines = new StringBuilder();
            for (Map.Entry<String, long[]> entry : counts.entrySet()) {
                lines.append(entry.getKey()).append('\t').append(entry.getValue()[0]).append('\t')
                        .append(entry.getValue()[1]).append('\n');
            }
            counts.clear();
            return lines.toString();
        }

        synchronized int admittedCount() {
            return admitted.values().stream().mapToInt(Set::size).sum();
        }

        synchronized void close() throws IOException {
            out.close();
        }
    }
}
