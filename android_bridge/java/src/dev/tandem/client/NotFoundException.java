package dev.tandem.client;

/** HTTP 404: e.g. an unknown model ({@link #getCode()} {@code "model_not_found"}). */
public class NotFoundException extends TandemException {
    private static final long serialVersionUID = 1L;

    public NotFoundException(String message, int httpStatus, String type, String code, String param, Throwable cause) {
        super(message, httpStatus, type, code, param, cause);
    }
}
