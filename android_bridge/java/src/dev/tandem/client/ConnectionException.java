package dev.tandem.client;

/**
 * An I/O failure before or while talking to the server: refused connection, unknown host, connection
 * reset, a stream that ended before {@code [DONE]}. {@link #getHttpStatus()} is 0 unless the failure
 * happened after a status line arrived. The cause is the underlying {@link java.io.IOException}.
 */
public class ConnectionException extends TandemException {
    private static final long serialVersionUID = 1L;

    public ConnectionException(String message, int httpStatus, Throwable cause) {
        super(message, httpStatus, null, null, null, cause);
    }
}
