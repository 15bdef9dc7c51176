// Real-Time Mode's JVM ForeachWriter: rows to PostgreSQL in small offset-marker transactions.
package io.reconcile.realtime;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * The JVM twin of reconcile.spark.realtime.RealtimeForeachWriter: one per task, it buffers the
 * rows Spark hands it and commits them through {@link OffsetTxn} when {@code rowsPerTxn} rows
 * are buffered, when the oldest buffered row is {@code msPerTxn} old (a timer in the task
 * commits then even if no further row arrives), and when the task ends. Built on the driver by
 * reconcile.spark.realtime.start_realtime(writer="jvm"), which creates and checks the marker
 * table first; each task's open() reads the table's catalog facts again and refuses it unless
 * they are the ones the driver's checks passed on. The connection's password is a field (the
 * task needs it) but never shown.
 */
public final class MarkerWriter extends ForeachWriter<Row> {
  private static final long serialVersionUID = 1L;

  private final String url;
  private final HashMap<String, String> properties;
  private final String schema;
  private final String table;
  private final ArrayList<String> columns;
  private final String pipeline;
  private final String sink;
  private final String stateSchema;
  private final String markers;
  private final int[] place; // the row's indices of topic, partition, offset
  private final int[] valueIndices; // the row's index of each target column
  private final int rowsPerTxn;
  private final long msPerTxn;
  private final String markerFactsQuery;
  private final String markerFacts;

  private transient OffsetTxn txn;
  private transient List<OffsetRecord> buffer;
  private transient long since;
  private transient ScheduledThreadPoolExecutor timer;
  private transient RuntimeException failure;

  /**
   * A writer of rows laid out as {@code rowIndices} says.
   *
   * @param url the JDBC URL (no secret in it)
   * @param properties the JDBC connection properties (the password among them)
   * @param rowIndices the row's index of topic, partition, offset, then of each target column
   * @param markerFactsQuery the query of the marker table's catalog facts (parameters: its
   *     schema and name), sinks/objects/catalog.py's RELATION_FACTS_SQL
   * @param markerFacts its answer that the driver's checks passed on
   */
  public MarkerWriter(String url, Map<String, String> properties, String schema, String table,
      List<String> columns, String pipeline, String sink, String stateSchema, String markers,
      List<Integer> rowIndices, int rowsPerTxn, long msPerTxn, String markerFactsQuery,
      String markerFacts) {
    if (rowsPerTxn < 1 || msPerTxn < 0) {
      throw new IllegalArgumentException("real-time sink " + sink + ": rowsPerTxn must be >= 1 "
          + "and msPerTxn >= 0, got " + rowsPerTxn + " and " + msPerTxn);
    }
    if (rowIndices.size() != 3 + columns.size()) {
      throw new IllegalArgumentException("real-time sink " + sink + ": " + rowIndices.size()
          + " row indices for 3 Kafka columns and " + columns.size() + " target columns");
    }
    this.url = url;
    this.properties = new HashMap<>(properties);
    this.schema = schema;
    this.table = table;
    this.columns = new ArrayList<>(columns);
    this.pipeline = pipeline;
    this.sink = sink;
    this.stateSchema = stateSchema;
    this.markers = markers;
    this.place = new int[] {rowIndices.get(0), rowIndices.get(1), rowIndices.get(2)};
    this.valueIndices = new int[columns.size()];
    for (int i = 0; i < valueIndices.length; i++) {
      valueIndices[i] = rowIndices.get(3 + i);
    }
    this.rowsPerTxn = rowsPerTxn;
    this.msPerTxn = msPerTxn;
    this.markerFactsQuery = markerFactsQuery;
    this.markerFacts = markerFacts;
  }

  /**
   * Refuse the marker table unless its catalog facts are the ones the driver vetted.
   *
   * <p>The rule (who may own and reach the table, its columns and key, no triggers, rules or
   * row-level security) is written once, in Python (sinks/objects/catalog.py), and run on the
   * driver, which reads the facts it passed on in the same snapshot. A task cannot run the
   * rule; it reads the facts with the same query and requires the same line, so a grant to
   * another role, a column or a trigger added since the query started is refused here, as the
   * Python writer's tasks refuse it by running the rule.
   */
  static void checkMarkers(Connection conn, String query, String stateSchema, String markers,
      String vetted, String sink) {
    String found;
    try (PreparedStatement st = conn.prepareStatement(query)) {
      st.setString(1, stateSchema);
      st.setString(2, markers);
      try (ResultSet rs = st.executeQuery()) {
        found = rs.next() ? rs.getString(1) : null;
      }
    } catch (SQLException e) {
      throw new SinkException("real-time sink " + sink + ": cannot read the catalog of the "
          + "offset markers " + stateSchema + "." + markers + ": " + e.getMessage(), e);
    }
    if (!vetted.equals(found)) {
      // The markers decide which rows a replay skips: a table another role can write, or of
      // another shape, could make the writer drop rows, so it is never used.
      throw new SinkException("real-time sink " + sink + ": refusing to use the offset markers "
          + stateSchema + "." + markers + ": "
          + (found == null ? "the table is gone" : "the table changed since the query started "
              + "and checked it (now: " + found + "; checked: " + vetted + ")")
          + ". Another role may reach it or its shape differs: fix or drop it as its owner, and "
          + "start the query again (its start checks the table anew)", null);
    }
  }

  /** Open a JDBC connection; an error names the sink and never holds the password. */
  static Connection connect(String url, Map<String, String> properties, String sink) {
    Properties props = new Properties();
    props.putAll(properties);
    try {
      // The driver class directly, not DriverManager: the JAR comes through spark.jars, in a
      // class loader DriverManager does not search.
      Connection conn = new org.postgresql.Driver().connect(url, props);
      if (conn == null) {
        throw new SinkException("real-time sink " + sink + ": not a PostgreSQL URL: " + url, null);
      }
      return conn;
    } catch (SQLException e) {
      String message = String.valueOf(e.getMessage());
      String password = properties.get("password");
      if (password != null && !password.isEmpty()) {
        message = message.replace(password, "***");
      }
      // The cause is left out: its message, and its own causes', are not redacted.
      throw new SinkException("real-time sink " + sink + ": cannot connect to " + url + ": "
          + message, null);
    }
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    // Always true: the epoch alone cannot say what is written (a batch is long and committed
    // in parts), the markers say it row by row.
    Connection conn = connect(url, properties, sink);
    try {
      checkMarkers(conn, markerFactsQuery, stateSchema, markers, markerFacts, sink);
      txn = new OffsetTxn(conn, schema, table, columns, pipeline, sink, stateSchema, markers);
    } catch (RuntimeException e) {
      try {
        conn.close();
      } catch (SQLException closing) {
        e.addSuppressed(closing);
      }
      throw e;
    }
    buffer = new ArrayList<>();
    failure = null;
    if (msPerTxn > 0) {
      timer = new ScheduledThreadPoolExecutor(1, r -> {
        Thread t = new Thread(r, "reconcile-realtime-" + sink + "-" + partitionId);
        t.setDaemon(true);
        return t;
      });
      // close() commits what is left itself: a commit still waiting on the timer is dropped.
      timer.setExecuteExistingDelayedTasksAfterShutdownPolicy(false);
    }
    return true;
  }

  @Override
  public synchronized void process(Row row) {
    raiseFailure();
    List<Object> values = new ArrayList<>(valueIndices.length);
    for (int i : valueIndices) {
      values.add(row.get(i));
    }
    if (buffer.isEmpty()) {
      since = System.nanoTime();
      if (timer != null) {
        timer.schedule(this::flushIfDue, msPerTxn, TimeUnit.MILLISECONDS);
      }
    }
    // Kafka's partition is an int and its offset a long; read as numbers all the same.
    buffer.add(new OffsetRecord(row.getString(place[0]), ((Number) row.get(place[1])).intValue(),
        ((Number) row.get(place[2])).longValue(), values));
    if (buffer.size() >= rowsPerTxn || ageMs() >= msPerTxn) {
      flush();
    }
  }

  private long ageMs() {
    return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - since);
  }

  /** The timer's commit: the oldest buffered row is msPerTxn old, whether or not rows come. */
  private synchronized void flushIfDue() {
    if (failure != null || buffer == null || buffer.isEmpty() || txn == null) {
      return;
    }
    long age = ageMs();
    if (age < msPerTxn) {
      // The buffer was committed by count meanwhile and refilled: due later.
      try {
        timer.schedule(this::flushIfDue, msPerTxn - age, TimeUnit.MILLISECONDS);
      } catch (RejectedExecutionException e) {
        // close() has begun: it commits the buffer itself.
      }
      return;
    }
    try {
      flush();
    } catch (RuntimeException e) {
      // Not thrown here (the timer's thread would swallow it): the next process() or close()
      // throws it, and the task fails, so Spark runs the batch again.
      failure = e;
    }
  }

  private void flush() {
    if (!buffer.isEmpty()) {
      txn.commit(buffer);
      buffer = new ArrayList<>();
    }
  }

  private void raiseFailure() {
    if (failure != null) {
      throw failure;
    }
  }

  @Override
  public void close(Throwable error) {
    if (timer != null) {
      // Not shutdownNow(): a commit the timer is running finishes (close() waits for it on
      // the lock) rather than being interrupted inside the JDBC driver.
      timer.shutdown();
    }
    synchronized (this) {
      try {
        // A failed task's buffer is dropped, not committed: Spark runs the batch again from
        // its start offsets, and the replay writes these rows then (the markers skip only
        // what was committed).
        if (error == null && txn != null) {
          raiseFailure();
          flush();
        }
      } finally {
        if (txn != null) {
          txn.close();
          txn = null;
        }
      }
    }
  }

  @Override
  public String toString() { // the properties hold the password
    return "MarkerWriter(" + schema + "." + table + ", " + pipeline + "/" + sink + ")";
  }
}
