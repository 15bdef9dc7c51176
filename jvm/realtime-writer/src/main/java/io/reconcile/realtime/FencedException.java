// The writer's topic-partition was claimed by a newer generation: its transaction rolled back.
package io.reconcile.realtime;

/**
 * Raised inside a transaction when a newer writer claimed one of its topic-partitions (this
 * writer is a zombie: a task of a failed batch, or of a driver that died); nothing of the
 * transaction was written (the twin of reconcile.core.contract.FencedError).
 */
public final class FencedException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The message names the sink, the topic-partition and both generations. */
  public FencedException(String message) {
    super(message);
  }
}
