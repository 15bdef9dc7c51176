// A minimal JVM ForeachWriter for benchmarks/realtime_probe.py: one line per row, flushed per row.
package probe;

import java.io.FileWriter;
import java.io.IOException;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/** Appends "partition offset produced_ms processed_ms" per row, flushed per row. */
public class StampWriter extends ForeachWriter<Row> {
  private final String path;
  private transient FileWriter out;

  public StampWriter(String path) { this.path = path; }

  @Override public boolean open(long partitionId, long epochId) {
    try { out = new FileWriter(path + "-" + partitionId + "-" + epochId, true); }
    catch (IOException e) { throw new RuntimeException(e); }
    return true;
  }

  @Override public void process(Row row) {
    try {
      out.write(row.getAs("partition") + " " + row.getAs("offset") + " " + row.getAs("value")
          + " " + System.currentTimeMillis() + "\n");
      out.flush();
    } catch (IOException e) { throw new RuntimeException(e); }
  }

  @Override public void close(Throwable error) {
    try { if (out != null) out.close(); } catch (IOException e) { throw new RuntimeException(e); }
  }
}
