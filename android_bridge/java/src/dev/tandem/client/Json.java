package dev.tandem.client;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small, strict JSON (RFC 8259) reader and writer, so the client needs no library.
 *
 * <p>{@link #parse} maps objects to {@code Map<String, Object>} (insertion ordered), arrays to
 * {@code List<Object>}, strings to {@code String}, integers that fit to {@code Long}, other numbers to
 * {@code Double}, {@code true}/{@code false} to {@code Boolean} and {@code null} to {@code null}.
 * Anything malformed (including trailing content and nesting deeper than {@link #MAX_DEPTH}) raises a
 * checked {@link ParseException}; it never throws an unchecked exception for bad input.
 *
 * <p>{@link #write} accepts those types back (any {@link Map}, {@link Collection}, {@code Object[]},
 * {@link CharSequence}, {@link Number}, {@link Boolean}, {@code null}). All methods are stateless and
 * thread-safe.
 */
public final class Json {
    /** Deepest nesting {@link #parse} accepts; deeper input is rejected instead of overflowing the stack. */
    public static final int MAX_DEPTH = 512;

    private Json() {
    }

    /** Malformed JSON text; {@link #getOffset()} is the character index where reading failed. */
    public static final class ParseException extends Exception {
        private static final long serialVersionUID = 1L;
        private final int offset;

        ParseException(String message, int offset) {
            super(message + " at offset " + offset);
            this.offset = offset;
        }

        public int getOffset() {
            return offset;
        }
    }

    // ---------------------------------------------------------------------------------------- parsing

    /** Parses one JSON value that must span all of {@code text} (whitespace around it allowed). */
    public static Object parse(String text) throws ParseException {
        if (text == null) {
            throw new ParseException("null input", 0);
        }
        Parser parser = new Parser(text);
        parser.skipWhitespace();
        Object value = parser.readValue(0);
        parser.skipWhitespace();
        if (parser.pos != text.length()) {
            throw new ParseException("unexpected trailing content", parser.pos);
        }
        return value;
    }

    /** Parses text that must be a JSON object. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(String text) throws ParseException {
        Object value = parse(text);
        if (!(value instanceof Map)) {
            throw new ParseException("expected a JSON object", 0);
        }
        return (Map<String, Object>) value;
    }

    private static final class Parser {
        private final String s;
        private int pos;

        Parser(String s) {
            this.s = s;
        }

        void skipWhitespace() {
            while (pos < s.length()) {
                char c = s.charAt(pos);
                if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                    pos++;
                } else {
                    return;
                }
            }
        }

        Object readValue(int depth) throws ParseException {
            if (depth > MAX_DEPTH) {
                throw new ParseException("nesting deeper than " + MAX_DEPTH, pos);
            }
            if (pos >= s.length()) {
                throw new ParseException("unexpected end of input", pos);
            }
            char c = s.charAt(pos);
            switch (c) {
                case '{':
                    return readObject(depth);
                case '[':
                    return readArray(depth);
                case '"':
                    return readString();
                case 't':
                    expectWord("true");
                    return Boolean.TRUE;
                case 'f':
                    expectWord("false");
                    return Boolean.FALSE;
                case 'n':
                    expectWord("null");
                    return null;
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return readNumber();
                    }
                    throw new ParseException("unexpected character '" + printable(c) + "'", pos);
            }
        }

        private void expectWord(String word) throws ParseException {
            if (!s.startsWith(word, pos)) {
                throw new ParseException("invalid literal, expected " + word, pos);
            }
            pos += word.length();
        }

        private Map<String, Object> readObject(int depth) throws ParseException {
            pos++; // '{'
            Map<String, Object> map = new LinkedHashMap<String, Object>();
            skipWhitespace();
            if (peek() == '}') {
                pos++;
                return map;
            }
            while (true) {
                skipWhitespace();
                if (peek() != '"') {
                    throw new ParseException("expected a string key", pos);
                }
                String key = readString();
                skipWhitespace();
                if (peek() != ':') {
                    throw new ParseException("expected ':'", pos);
                }
                pos++;
                skipWhitespace();
                map.put(key, readValue(depth + 1));
                skipWhitespace();
                char c = peek();
                pos++;
                if (c == '}') {
                    return map;
                }
                if (c != ',') {
                    throw new ParseException("expected ',' or '}'", pos - 1);
                }
            }
        }

        private List<Object> readArray(int depth) throws ParseException {
            pos++; // '['
            List<Object> list = new ArrayList<Object>();
            skipWhitespace();
            if (peek() == ']') {
                pos++;
                return list;
            }
            while (true) {
                skipWhitespace();
                list.add(readValue(depth + 1));
                skipWhitespace();
                char c = peek();
                pos++;
                if (c == ']') {
                    return list;
                }
                if (c != ',') {
                    throw new ParseException("expected ',' or ']'", pos - 1);
                }
            }
        }

        /** The current character, or NUL at the end (NUL is never valid there, so callers fail cleanly). */
        private char peek() {
            return pos < s.length() ? s.charAt(pos) : '\0';
        }

        private String readString() throws ParseException {
            int start = ++pos; // past '"'
            StringBuilder out = null;
            while (true) {
                if (pos >= s.length()) {
                    throw new ParseException("unterminated string", start - 1);
                }
                char c = s.charAt(pos);
                if (c == '"') {
                    String result = out == null ? s.substring(start, pos) : out.append(s, start, pos).toString();
                    pos++;
                    return result;
                }
                if (c < 0x20) {
                    throw new ParseException("unescaped control character in string", pos);
                }
                if (c != '\\') {
                    pos++;
                    continue;
                }
                if (out == null) {
                    out = new StringBuilder();
                }
                out.append(s, start, pos);
                pos++;
                if (pos >= s.length()) {
                    throw new ParseException("unterminated escape", pos);
                }
                char e = s.charAt(pos++);
                switch (e) {
                    case '"':
                        out.append('"');
                        break;
                    case '\\':
                        out.append('\\');
                        break;
                    case '/':
                        out.append('/');
                        break;
                    case 'b':
                        out.append('\b');
                        break;
                    case 'f':
                        out.append('\f');
                        break;
                    case 'n':
                        out.append('\n');
                        break;
                    case 'r':
                        out.append('\r');
                        break;
                    case 't':
                        out.append('\t');
                        break;
                    case 'u':
                        // A surrogate pair arrives as two escapes; appending both UTF-16 units rebuilds it.
                        out.append(readHex4());
                        break;
                    default:
                        throw new ParseException("invalid escape '\\" + printable(e) + "'", pos - 1);
                }
                start = pos;
            }
        }

        private char readHex4() throws ParseException {
            if (pos + 4 > s.length()) {
                throw new ParseException("truncated \\u escape", pos);
            }
            int value = 0;
            for (int i = 0; i < 4; i++) {
                int digit = Character.digit(s.charAt(pos + i), 16);
                if (digit < 0) {
                    throw new ParseException("invalid hex digit in \\u escape", pos + i);
                }
                value = value * 16 + digit;
            }
            pos += 4;
            return (char) value;
        }

        private Object readNumber() throws ParseException {
            int start = pos;
            if (peek() == '-') {
                pos++;
            }
            if (peek() == '0') {
                pos++;
            } else if (peek() >= '1' && peek() <= '9') {
                while (peek() >= '0' && peek() <= '9') {
                    pos++;
                }
            } else {
                throw new ParseException("invalid number", pos);
            }
            boolean integral = true;
            if (peek() == '.') {
                integral = false;
                pos++;
                if (!(peek() >= '0' && peek() <= '9')) {
                    throw new ParseException("expected a digit after '.'", pos);
                }
                while (peek() >= '0' && peek() <= '9') {
                    pos++;
                }
            }
            if (peek() == 'e' || peek() == 'E') {
                integral = false;
                pos++;
                if (peek() == '+' || peek() == '-') {
                    pos++;
                }
                if (!(peek() >= '0' && peek() <= '9')) {
                    throw new ParseException("expected a digit in the exponent", pos);
                }
                while (peek() >= '0' && peek() <= '9') {
                    pos++;
                }
            }
            String literal = s.substring(start, pos);
            if (integral && literal.length() <= 20) { // longer cannot fit a long (19 digits and a sign)
                try {
                    return Long.valueOf(literal);
                } catch (NumberFormatException tooBig) {
                    // falls through to Double
                }
            }
            return Double.valueOf(literal);
        }
    }

    private static String printable(char c) {
        return c < 0x20 || c > 0x7e ? String.format("\\u%04x", (int) c) : String.valueOf(c);
    }

    // ---------------------------------------------------------------------------------------- writing

    /**
     * Serializes {@code value} as compact JSON. Control characters, lone surrogates and U+2028/U+2029 are
     * written as {@code \}{@code uXXXX}; other non-ASCII characters are written as is (send as UTF-8).
     *
     * @throws IllegalArgumentException for a type JSON cannot hold, a non-finite number, or a
     *     structure nested deeper than {@link #MAX_DEPTH} (a cycle, say)
     */
    public static String write(Object value) {
        StringBuilder out = new StringBuilder();
        writeValue(out, value, 0);
        return out.toString();
    }

    private static void writeValue(StringBuilder out, Object value, int depth) {
        if (depth > MAX_DEPTH) {
            throw new IllegalArgumentException("JSON nesting deeper than " + MAX_DEPTH + " (a cycle?)");
        }
        if (value == null) {
            out.append("null");
        } else if (value instanceof CharSequence) {
            writeString(out, value.toString());
        } else if (value instanceof Boolean) {
            out.append(((Boolean) value).booleanValue() ? "true" : "false");
        } else if (value instanceof Double || value instanceof Float) {
            double d = ((Number) value).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new IllegalArgumentException("JSON has no NaN or Infinity: " + d);
            }
            out.append(value.toString()); // e.g. 0.7, 2.0, 1.0E-5, -0.0: all valid JSON numbers
        } else if (value instanceof Number) {
            out.append(value.toString()); // Long, Integer, Short, Byte, BigInteger, BigDecimal
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                writeString(out, String.valueOf(entry.getKey()));
                out.append(':');
                writeValue(out, entry.getValue(), depth + 1);
            }
            out.append('}');
        } else if (value instanceof Collection) {
            writeArray(out, (Collection<?>) value, depth);
        } else if (value instanceof Object[]) {
            List<Object> items = new ArrayList<Object>();
            Collections.addAll(items, (Object[]) value);
            writeArray(out, items, depth);
        } else {
            throw new IllegalArgumentException("cannot write " + value.getClass().getName() + " as JSON");
        }
    }

    private static void writeArray(StringBuilder out, Collection<?> items, int depth) {
        out.append('[');
        boolean first = true;
        for (Object item : items) {
            if (!first) {
                out.append(',');
            }
            first = false;
            writeValue(out, item, depth + 1);
        }
        out.append(']');
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private static void writeString(StringBuilder out, String s) {
        out.append('"');
        int n = s.length();
        for (int i = 0; i < n; i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    out.append("\\\"");
                    break;
                case '\\':
                    out.append("\\\\");
                    break;
                case '\n':
                    out.append("\\n");
                    break;
                case '\r':
                    out.append("\\r");
                    break;
                case '\t':
                    out.append("\\t");
                    break;
                case '\b':
                    out.append("\\b");
                    break;
                case '\f':
                    out.append("\\f");
                    break;
                default:
                    if (c < 0x20 || c == '\u2028' || c == '\u2029') {
                        appendUnicodeEscape(out, c);
                    } else if (Character.isHighSurrogate(c) && i + 1 < n && Character.isLowSurrogate(s.charAt(i + 1))) {
                        out.append(c).append(s.charAt(++i)); // a whole pair: valid UTF-16, written as is
                    } else if (Character.isSurrogate(c)) {
                        appendUnicodeEscape(out, c); // lone surrogate: escaped so the output stays valid UTF-8
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }

    private static void appendUnicodeEscape(StringBuilder out, char c) {
        out.append("\\u").append(HEX[(c >> 12) & 0xf]).append(HEX[(c >> 8) & 0xf])
                .append(HEX[(c >> 4) & 0xf]).append(HEX[c & 0xf]);
    }

    // ------------------------------------------------------------------- typed access (package use)

    @SuppressWarnings("unchecked")
    static Map<String, Object> getMap(Map<String, Object> map, String key) {
        Object value = map == null ? null : map.get(key);
        return value instanceof Map ? (Map<String, Object>) value : null;
    }

    @SuppressWarnings("unchecked")
    static List<Object> getList(Map<String, Object> map, String key) {
        Object value = map == null ? null : map.get(key);
        return value instanceof List ? (List<Object>) value : null;
    }

    static String getString(Map<String, Object> map, String key) {
        Object value = map == null ? null : map.get(key);
        return value instanceof String ? (String) value : null;
    }

    static Long getLong(Map<String, Object> map, String key) {
        Object value = map == null ? null : map.get(key);
        return value instanceof Number ? Long.valueOf(((Number) value).longValue()) : null;
    }

    static Double getDouble(Map<String, Object> map, String key) {
        Object value = map == null ? null : map.get(key);
        return value instanceof Number ? Double.valueOf(((Number) value).doubleValue()) : null;
    }

    static boolean getBoolean(Map<String, Object> map, String key) {
        Object value = map == null ? null : map.get(key);
        return value instanceof Boolean && ((Boolean) value).booleanValue();
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> firstChoice(Map<String, Object> map) {
        List<Object> choices = getList(map, "choices");
        if (choices == null || choices.isEmpty() || !(choices.get(0) instanceof Map)) {
            return null;
        }
        return (Map<String, Object>) choices.get(0);
    }
}
