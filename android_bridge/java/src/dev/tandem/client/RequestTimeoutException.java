package dev.tandem.client;

/**
 * The connect timeout or the read timeout ran out (for a stream, the read timeout is the longest gap
 * allowed between two arrivals of bytes); also an HTTP 408. A {@link ConnectionException}, so catching
 * that covers timeouts too.
 */
public class RequestTimeoutException extends ConnectionException {
    private static final long serialVersionUID = 1L;

    public RequestTimeoutException(String message, int httpStatus, Throwable cause) {
        super(message, httpStatus, cause);
    }
}
