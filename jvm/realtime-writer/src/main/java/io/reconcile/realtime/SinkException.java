// A failure of the real-time sink's JDBC work, named by the sink, never carrying a password.
package io.reconcile.realtime;

/** A statement or connection failure of the real-time sink, its message naming the sink. */
public final class SinkException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** {@code message} must hold no secret: callers build it from names and the server's text. */
  public SinkException(String message, Throwable cause) {
    super(message, cause);
  }
}
