package dev.tandem.client;

/**
 * Any failure of a tandem call: an error response from the server, a broken or timed-out connection, a
 * malformed reply, or a cancelled stream.
 *
 * <p>It is a checked {@link Exception} and deliberately not an {@link java.io.IOException}: most of its
 * subclasses (a 400, a 401, a cancellation) are not I/O failures, and keeping it apart means a caller's
 * generic {@code catch (IOException e)} cannot swallow an API error by accident. Java callers must handle
 * it; Kotlin callers catch it like any other exception.
 *
 * <p>Subclasses, from the HTTP status or the failure:
 * <ul>
 *   <li>{@link InvalidRequestException}: 400 (and 422); {@link #getParam()} names the offending field</li>
 *   <li>{@link AuthenticationException}: 401 and 403 (missing or wrong API key)</li>
 *   <li>{@link NotFoundException}: 404 (an unknown model, say)</li>
 *   <li>{@link RateLimitException}: 429, with the server's Retry-After</li>
 *   <li>{@link ServerException}: other 5xx or a reply that cannot be parsed;
 *       its subclass {@link ServiceUnavailableException} is 503 (overloaded or still loading), with Retry-After</li>
 *   <li>{@link ConnectionException}: I/O failure before or while talking (no usable response);
 *       its subclass {@link RequestTimeoutException} is a connect or read timeout</li>
 *   <li>{@link CancelledException}: {@link StreamCall#cancel()} ended the stream</li>
 * </ul>
 * Any other status gives a plain {@code TandemException}.
 */
public class TandemException extends Exception {
    private static final long serialVersionUID = 1L;

    private final int httpStatus;
    private final String type;
    private final String code;
    private final String param;

    public TandemException(String message, int httpStatus, String type, String code, String param, Throwable cause) {
        super(message, cause);
        this.httpStatus = httpStatus;
        this.type = type;
        this.code = code;
        this.param = param;
    }

    public TandemException(String message, Throwable cause) {
        this(message, 0, null, null, null, cause);
    }

    /**
     * The HTTP status of the response that carried the error; 0 when there was no HTTP response (a
     * connection failure, a timeout, a cancellation). An error event sent inside a stream, after the
     * 200 status line went out, reports 200.
     */
    public int getHttpStatus() {
        return httpStatus;
    }

    /** OpenAI's {@code error.type}, e.g. {@code "invalid_request_error"}; null when the server sent none. */
    public String getType() {
        return type;
    }

    /** OpenAI's {@code error.code}, e.g. {@code "invalid_api_key"} or {@code "model_not_found"}; nullable. */
    public String getCode() {
        return code;
    }

    /** OpenAI's {@code error.param}: the request field at fault, e.g. {@code "temperature"}; nullable. */
    public String getParam() {
        return param;
    }
}
