package dev.tandem.client;

/** HTTP 503: the server is overloaded or still loading its model; retry after {@link #getRetryAfterSeconds()}. */
public class ServiceUnavailableException extends ServerException {
    private static final long serialVersionUID = 1L;

    private final Long retryAfterSeconds;

    public ServiceUnavailableException(String message, int httpStatus, String type, String code, String param, Long retryAfterSeconds,
            Throwable cause) {
        super(message, httpStatus, type, code, param, cause);
        this.retryAfterSeconds = retryAfterSeconds;
    }

    /** Seconds to wait from the response's Retry-After header (seconds or an HTTP date); null when absent. */
    public Long getRetryAfterSeconds() {
        return retryAfterSeconds;
    }
}
