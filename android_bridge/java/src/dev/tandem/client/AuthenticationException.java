package dev.tandem.client;

/** HTTP 401 or 403: the API key is missing or wrong ({@link #getCode()} is {@code "invalid_api_key"}). */
public class AuthenticationException extends TandemException {
    private static final long serialVersionUID = 1L;

    public AuthenticationException(String message, int httpStatus, String type, String code, String param, Throwable cause) {
        super(message, httpStatus, type, code, param, cause);
    }
}
