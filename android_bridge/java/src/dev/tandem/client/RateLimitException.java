package dev.tandem.client;

/** HTTP 429: too many requests; wait {@link #getRetryAfterSeconds()} before retrying. */
public class RateLimitException extends TandemException {
    private static final long serialVersionUID = 1L;

    private final Long retryAfterSeconds;

    public RateLimitException(String message, int httpStatus, String type, String code, String param, Long retryAfterSeconds,
            Throwable cause) {
        super(message, httpStatus, type, code, param, cause);
        this.retryAfterSeconds = retryAfterSeconds;
    }

    /** Seconds to wait from the response's Retry-After header (seconds or an HTTP date); null when absent. */
    public Long getRetryAfterSeconds() {
        return retryAfterSeconds;
    }
}
