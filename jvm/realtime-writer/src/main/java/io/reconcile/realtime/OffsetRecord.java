// One Kafka record to write: where it came from, and the target row's values.
package io.reconcile.realtime;

import java.util.List;

/**
 * One Kafka record for {@link OffsetTxn}: its topic, partition and offset, and the target row's
 * values in the target's column order (the twin of sinks.realtime.OffsetRecord).
 */
public record OffsetRecord(String topic, int partition, long offset, List<Object> values) {}
