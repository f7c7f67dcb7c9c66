package dev.tandem.client;

import java.text.SimpleDateFormat;
import java.util.Date;
import java.util.Locale;
import java.util.Map;
import java.util.TimeZone;

/** Maps error responses and in-stream error events to the typed exceptions. Stateless. */
final class Errors {
    private static final int MAX_MESSAGE_BODY_CHARS = 500;

    private Errors() {
    }

    /**
     * The exception for an HTTP error status. An OpenAI-shaped body {@code {"error": {...}}} gives the
     * message, type, code and param; FastAPI's {@code {"detail": ...}} or any other body gives only a message.
     */
    static TandemException forResponse(int status, String body, String retryAfterHeader) {
        String message = null;
        String type = null;
        String code = null;
        String param = null;
        Map<String, Object> parsed = null;
        try {
            parsed = Json.parseObject(body);
        } catch (Json.ParseException notJson) {
            // keep the raw text as the message below
        }
        if (parsed != null) {
            Map<String, Object> error = Json.getMap(parsed, "error");
            if (error != null) {
                message = Json.getString(error, "message");
                type = Json.getString(error, "type");
                code = stringOf(error.get("code")); // some servers send a number
                param = Json.getString(error, "param");
            } else if (parsed.get("error") instanceof String) {
                message = (String) parsed.get("error");
            } else if (parsed.get("detail") != null) {
                Object detail = parsed.get("detail");
                message = detail instanceof String ? (String) detail : Json.write(detail);
            }
        }
        if (message == null) {
            String text = body == null ? "" : body.trim();
            if (text.length() > MAX_MESSAGE_BODY_CHARS) {
                text = text.substring(0, MAX_MESSAGE_BODY_CHARS) + "...";
            }
            message = "HTTP " + status + (text.isEmpty() ? defaultExplanation(status) : ": " + text);
        }
        Long retryAfter = parseRetryAfter(retryAfterHeader, System.currentTimeMillis());
        return build(status, status, message, type, code, param, retryAfter);
    }

    /**
     * The exception class that {@code kind} (an HTTP status) calls for, reporting {@code httpStatus}: the
     * same number for an error response, 200 for an error event inside a stream.
     */
    static TandemException build(int kind, int httpStatus, String message, String type, String code, String param,
            Long retryAfter) {
        switch (kind) {
            case 400:
            case 422:
                return new InvalidRequestException(message, httpStatus, type, code, param, null);
            case 401:
            case 403:
                return new AuthenticationException(message, httpStatus, type, code, param, null);
            case 404:
                return new NotFoundException(message, httpStatus, type, code, param, null);
            case 408:
                return new RequestTimeoutException(message, httpStatus, null);
            case 429:
                return new RateLimitException(message, httpStatus, type, code, param, retryAfter, null);
            case 503:
                return new ServiceUnavailableException(message, httpStatus, type, code, param, retryAfter, null);
            default:
                if (kind >= 500) {
                    return new ServerException(message, httpStatus, type, code, param, null);
                }
                return new TandemException(message, httpStatus, type, code, param, null);
        }
    }

    /**
     * The exception for an error event inside a stream (the status line, 200, was already sent): its type
     * and code pick the class the same failure would have had as an error response.
     */
    static TandemException forStreamEvent(Map<String, Object> error) {
        String message = Json.getString(error, "message");
        String type = Json.getString(error, "type");
        String code = stringOf(error.get("code"));
        String param = Json.getString(error, "param");
        if (message == null) {
            message = "the server reported an error inside the stream: " + Json.write(error);
        }
        int kind;
        if ("invalid_api_key".equals(code) || "authentication_error".equals(type) || "permission_error".equals(type)) {
            kind = 401;
        } else if ("model_not_found".equals(code) || "not_found_error".equals(type)) {
            kind = 404;
        } else if ("rate_limit_exceeded".equals(code) || "requests".equals(type) || "tokens".equals(type)) {
            kind = 429;
        } else if ("invalid_request_error".equals(type)) {
            kind = 400;
        } else if ("server_overloaded".equals(type) || "service_unavailable".equals(type)
                || "server_overloaded".equals(code) || "model_not_ready".equals(code)) {
            kind = 503;
        } else {
            kind = 500;
        }
        return build(kind, 200, message, type, code, param, null);
    }

    /**
     * Words for a status whose response had no body. Note the JDK's own HttpURLConnection (not Android's)
     * discards the body of a 401 answering a POST sent in streaming mode, so there a wrong key on
     * {@code chat}/{@code stream} arrives as a bare 401 without the server's message and code.
     */
    private static String defaultExplanation(int status) {
        switch (status) {
            case 401:
                return " Unauthorized: the API key is missing or wrong";
            case 403:
                return " Forbidden";
            case 404:
                return " Not Found";
            case 429:
                return " Too Many Requests";
            case 503:
                return " Service Unavailable";
            default:
                return "";
        }
    }

    private static String stringOf(Object value) {
        if (value == null) {
            return null;
        }
        return value instanceof String ? (String) value : Json.write(value);
    }

    /** Retry-After as whole seconds: delta-seconds, or an HTTP date relative to {@code nowMillis}; null if absent or bad. */
    static Long parseRetryAfter(String header, long nowMillis) {
        if (header == null) {
            return null;
        }
        String value = header.trim();
        if (value.isEmpty()) {
            return null;
        }
        try {
            double seconds = Double.parseDouble(value);
            if (seconds >= 0 && !Double.isInfinite(seconds)) {
                return Long.valueOf((long) Math.ceil(seconds));
            }
            return null;
        } catch (NumberFormatException notSeconds) {
            // maybe an HTTP date
        }
        SimpleDateFormat format = new SimpleDateFormat("EEE, dd MMM yyyy HH:mm:ss zzz", Locale.US);
        format.setTimeZone(TimeZone.getTimeZone("GMT"));
        try {
            Date date = format.parse(value);
            long millis = date.getTime() - nowMillis;
            return Long.valueOf(Math.max(0L, (millis + 999) / 1000));
        } catch (java.text.ParseException notADate) {
            return null;
        }
    }
}
