package dev.tandem.client;

/** HTTP 400 (or 422): the server rejected the request; {@link #getParam()} names the field at fault. */
public class InvalidRequestException extends TandemException {
    private static final long serialVersionUID = 1L;

    public InvalidRequestException(String message, int httpStatus, String type, String code, String param, Throwable cause) {
        super(message, httpStatus, type, code, param, cause);
    }
}
