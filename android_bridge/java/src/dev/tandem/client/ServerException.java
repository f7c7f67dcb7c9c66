package dev.tandem.client;

/** A 5xx other than 503, an error event inside a stream that names no client-side cause, or a reply the client could not parse (then {@link #getHttpStatus()} is the status it came with). */
public class ServerException extends TandemException {
    private static final long serialVersionUID = 1L;

    public ServerException(String message, int httpStatus, String type, String code, String param, Throwable cause) {
        super(message, httpStatus, type, code, param, cause);
    }
}
