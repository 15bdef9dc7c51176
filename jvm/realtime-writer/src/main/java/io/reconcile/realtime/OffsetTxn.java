// Small PostgreSQL transactions of Kafka records, each carrying its topic-partitions' offsets.
package io.reconcile.realtime;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Instant;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * One task's transactions, the same as sinks/postgres/realtime.py's RealtimeTxnWriter: each
 * commit locks the offset marker of every topic-partition its records come from (in
 * reconcile.reconcile_realtime_offsets, created and checked by the Python driver), claims the
 * next generation on its first transaction on a partition, is fenced when a newer generation
 * claimed it since, skips the records at or below the marker, and inserts the rest and moves
 * the marker up, all in one transaction. Identifiers are quoted, values are parameters.
 */
public final class OffsetTxn implements AutoCloseable {
  /** A Kafka topic-partition, ordered so that every writer locks markers in the same order. */
  record Partition(String topic, int partition) {}

  private static final Comparator<Partition> ORDER =
      Comparator.comparing(Partition::topic).thenComparingInt(Partition::partition);

  private final Connection conn;
  private final String sink;
  private final String pipeline;
  private final List<String> columns;
  private final String insert;
  private final String lock;
  private final String upsert;
  private final Map<Partition, Long> generations = new HashMap<>();

  /**
   * Bind a writer to an open connection; it runs its own transactions on it and owns it.
   *
   * @param conn an open connection (its autocommit is turned off here)
   * @param schema the target table's schema
   * @param table the target table
   * @param columns the target's columns, in the order of each record's values
   * @param pipeline the pipeline name of the markers
   * @param sink the sink name of the markers
   * @param stateSchema the schema of the marker table
   * @param markers the marker table's name
   */
  public OffsetTxn(Connection conn, String schema, String table, List<String> columns,
      String pipeline, String sink, String stateSchema, String markers) {
    this.conn = conn;
    this.sink = sink;
    this.pipeline = pipeline;
    this.columns = List.copyOf(columns);
    String marker = quote(stateSchema) + "." + quote(markers);
    List<String> quoted = new ArrayList<>();
    for (String c : this.columns) {
      quoted.add(quote(c));
    }
    this.insert = "INSERT INTO " + quote(schema) + "." + quote(table) + " ("
        + String.join(", ", quoted) + ") VALUES ("
        + String.join(", ", java.util.Collections.nCopies(quoted.size(), "?")) + ")";
    this.lock = "SELECT last_offset, generation FROM " + marker + " WHERE pipeline = ? AND sink = ?"
        + " AND topic = ? AND kafka_partition = ? FOR UPDATE";
    this.upsert = "INSERT INTO " + marker + " (pipeline, sink, topic, kafka_partition, "
        + "last_offset, generation) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline, sink, topic, "
        + "kafka_partition) DO UPDATE SET last_offset = EXCLUDED.last_offset, "
        + "generation = EXCLUDED.generation, updated_at = clock_timestamp()";
    try {
      conn.setAutoCommit(false);
    } catch (SQLException e) {
      throw new SinkException("real-time sink " + sink + ": cannot start transactions: "
          + e.getMessage(), e);
    }
  }

  /** A PostgreSQL identifier, quoted (a double quote in it doubled). */
  static String quote(String name) {
    if (name.indexOf('\0') >= 0) {
      throw new IllegalArgumentException("an identifier holds a NUL character");
    }
    return "\"" + name.replace("\"", "\"\"") + "\"";
  }

  /**
   * Write the records past their partitions' markers, and the markers, in one transaction.
   *
   * @return the rows written
   * @throws FencedException a newer writer claimed one of the partitions (nothing written)
   * @throws SinkException a statement failed (nothing written)
   */
  public int commit(List<OffsetRecord> records) {
    Map<Partition, List<OffsetRecord>> byPartition = new TreeMap<>(ORDER);
    for (OffsetRecord r : records) {
      byPartition.computeIfAbsent(new Partition(r.topic(), r.partition()), k -> new ArrayList<>())
          .add(r);
    }
    try {
      int written = 0;
      for (Map.Entry<Partition, List<OffsetRecord>> e : byPartition.entrySet()) {
        written += commitPartition(e.getKey(), e.getValue());
      }
      conn.commit();
      return written;
    } catch (SQLException | RuntimeException e) {
      // Whatever failed, the transaction goes whole: its rows and its markers together.
      rollback(e);
      if (e instanceof RuntimeException re) {
        throw re;
      }
      throw new SinkException("real-time sink " + sink + ": the transaction failed and was "
          + "rolled back: " + e.getMessage(), e);
    }
  }

  private int commitPartition(Partition p, List<OffsetRecord> group) throws SQLException {
    long last = -1;
    long newest = 0;
    try (PreparedStatement st = conn.prepareStatement(lock)) {
      st.setString(1, pipeline);
      st.setString(2, sink);
      st.setString(3, p.topic());
      st.setInt(4, p.partition());
      try (ResultSet rs = st.executeQuery()) { // the marker stays locked until COMMIT
        if (rs.next()) {
          last = rs.getLong(1);
          newest = rs.getLong(2);
        }
      }
    }
    Long mine = generations.get(p);
    if (mine == null) {
      // This task's first transaction on the partition: it claims the next generation,
      // which fences any older task still writing it (a zombie of a failed batch, or of
      // a driver that died).
      mine = newest + 1;
      generations.put(p, mine);
    } else if (newest > mine) {
      // A newer task claimed the partition since: this one is a zombie. Thrown inside
      // the transaction, which commit() rolls back with its rows.
      throw new FencedException("real-time sink " + sink + ": " + p.topic() + "["
          + p.partition() + "] was claimed by generation " + newest + "; this writer has "
          + mine + " and stops (nothing of this transaction was written)");
    }
    // A replay: Spark re-runs a batch from its start offsets, and the records at or below
    // the marker are in the target already (committed with it).
    List<OffsetRecord> fresh = new ArrayList<>();
    for (OffsetRecord r : group) {
      if (r.offset() > last) {
        fresh.add(r);
      }
    }
    long high = last;
    if (!fresh.isEmpty()) {
      try (PreparedStatement st = conn.prepareStatement(insert)) {
        for (OffsetRecord r : fresh) {
          bind(st, r);
          st.addBatch();
          high = Math.max(high, r.offset());
        }
        st.executeBatch();
      }
    }
    try (PreparedStatement st = conn.prepareStatement(upsert)) {
      st.setString(1, pipeline);
      st.setString(2, sink);
      st.setString(3, p.topic());
      st.setInt(4, p.partition());
      st.setLong(5, high);
      st.setLong(6, mine);
      st.executeUpdate();
    }
    return fresh.size();
  }

  private void bind(PreparedStatement st, OffsetRecord r) throws SQLException {
    if (r.values().size() != columns.size()) {
      throw new IllegalArgumentException("real-time sink " + sink + ": a record of "
          + r.topic() + "[" + r.partition() + "] at offset " + r.offset() + " has "
          + r.values().size() + " values for " + columns.size() + " columns");
    }
    for (int i = 0; i < columns.size(); i++) {
      Object v = r.values().get(i);
      // The JDBC driver takes no Instant (Spark's Java 8 time API gives one): the same
      // moment as a timestamptz in UTC.
      if (v instanceof Instant instant) {
        v = instant.atOffset(ZoneOffset.UTC);
      }
      try {
        st.setObject(i + 1, v);
      } catch (SQLException e) {
        throw new SinkException("real-time sink " + sink + ": column " + columns.get(i)
            + " cannot take a " + (v == null ? "null" : v.getClass().getName()) + ": "
            + e.getMessage(), e);
      }
    }
  }

  private void rollback(Exception cause) {
    try {
      conn.rollback();
    } catch (SQLException e) {
      cause.addSuppressed(e);
    }
  }

  /** Close the connection (an open transaction is rolled back by the server). */
  @Override
  public void close() {
    try {
      conn.close();
    } catch (SQLException e) {
      // Closing is the last thing the task does: nothing to roll back that the server
      // does not roll back itself when the connection goes.
    }
  }
}
