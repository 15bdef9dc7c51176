// The at-least-once JVM ForeachWriter of benchmarks.realtime: rows INSERTed in small transactions.
package bench;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.ZoneOffset;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * Inserts (id, part, off, produced) of each row into a table, committing every rowsPerTxn rows
 * or once the oldest uncommitted row is msPerTxn old (a timer commits then, even if no row
 * follows), and at the task's end; rowsPerTxn 1 is one autocommit INSERT a row. No markers, no
 * fencing: nothing guards a replayed batch (at-least-once). The baseline the exactly-once
 * MarkerWriter is measured against: the same JDBC driver and the same transaction bounds.
 */
public class InsertWriter extends ForeachWriter<Row> {
  private final String url;
  private final HashMap<String, String> properties;
  private final String table;
  private final int rowsPerTxn;
  private final long msPerTxn;
  private transient Connection conn;
  private transient PreparedStatement insert;
  private transient ScheduledExecutorService timer;
  private transient int buffered;
  private transient long since;
  private transient RuntimeException failed;

  public InsertWriter(String url, Map<String, String> properties, String table, int rowsPerTxn,
      long msPerTxn) {
    this.url = url;
    this.properties = new HashMap<>(properties);  // serializable, shipped to the tasks
    this.table = table;
    this.rowsPerTxn = rowsPerTxn;
    this.msPerTxn = msPerTxn;
  }

  @Override public synchronized boolean open(long partitionId, long epochId) {
    Properties props = new Properties();
    props.putAll(properties);
    try {
      // The driver class directly: the JAR comes through spark.jars, in a class loader
      // DriverManager does not search.
      conn = new org.postgresql.Driver().connect(url, props);
      conn.setAutoCommit(rowsPerTxn == 1);
      insert = conn.prepareStatement("INSERT INTO \"" + table.replace("\"", "\"\"")
          + "\" (id, part, off, produced) VALUES (?, ?, ?, ?)");
    } catch (SQLException e) {
      throw new RuntimeException("bench insert writer: cannot connect: " + e.getMessage(), e);
    }
    buffered = 0;
    failed = null;
    if (rowsPerTxn > 1) {
      timer = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "bench-insert-writer-timer");
        t.setDaemon(true);
        return t;
      });
      long tick = Math.max(1, msPerTxn / 4);
      timer.scheduleAtFixedRate(this::onTimer, tick, tick, TimeUnit.MILLISECONDS);
    }
    return true;
  }

  private synchronized void onTimer() {
    if (failed == null && buffered > 0 && System.currentTimeMillis() - since >= msPerTxn) {
      try {
        flush();
      } catch (RuntimeException e) {
        failed = e;  // thrown by the next process() or close(): the task fails
      }
    }
  }

  private void flush() {
    if (buffered == 0) return;
    try {
      insert.executeBatch();
      conn.commit();
    } catch (SQLException e) {
      throw new RuntimeException("bench insert writer: " + e.getMessage(), e);
    }
    buffered = 0;
  }

  @Override public synchronized void process(Row row) {
    if (failed != null) throw failed;
    Object produced = row.getAs("produced");
    // The JDBC driver takes no Instant: the same moment as a timestamptz in UTC.
    if (produced instanceof Instant instant) {
      produced = instant.atOffset(ZoneOffset.UTC);
    } else if (produced instanceof Timestamp stamp) {
      produced = stamp.toInstant().atOffset(ZoneOffset.UTC);
    }
    try {
      insert.setLong(1, row.<Long>getAs("id"));
      insert.setInt(2, row.<Integer>getAs("part"));
      insert.setLong(3, row.<Long>getAs("off"));
      insert.setObject(4, produced);
      if (rowsPerTxn == 1) {
        insert.executeUpdate();
        return;
      }
      insert.addBatch();
    } catch (SQLException e) {
      throw new RuntimeException("bench insert writer: " + e.getMessage(), e);
    }
    if (buffered++ == 0) since = System.currentTimeMillis();
    if (buffered >= rowsPerTxn) flush();
  }

  @Override public void close(Throwable error) {
    if (timer != null) timer.shutdownNow();
    synchronized (this) {
      try {
        if (error == null && failed == null) flush();
      } finally {
        try {
          if (conn != null) conn.close();
        } catch (SQLException e) {
          throw new RuntimeException(e);
        }
      }
      if (error == null && failed != null) throw failed;
    }
  }
}
